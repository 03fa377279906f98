"""The Python API's verbs: trigger and watch runs, manage schedules."""
