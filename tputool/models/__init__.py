"""tputool.models"""
