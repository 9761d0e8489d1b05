"""The `gpuctl` command line: parses options, calls one library function, renders the result."""
