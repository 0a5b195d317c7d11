"""The `denpex` command line: one module per subcommand, each thin (parse, call a layer, print).

Expected failures (bad arguments, unreadable input) end as one line on stderr and exit 2,
never as a traceback.
"""
