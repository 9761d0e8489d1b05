"""One module per tool family; each registers its parsers with ``@parser(...)``.

Modules are discovered automatically (``gpuctl.validation.parsing.registry``): adding a module
here is all it takes.
"""
