"""tputool.diagnose"""
