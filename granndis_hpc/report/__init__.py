"""`granndis report`: tables and plots of run directories, and the cost model they are compared with.

Imports no torch: a report runs where only the run directories are (command.py is the command).
"""
