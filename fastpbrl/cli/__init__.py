"""The command line: the ``fastpbrl`` command and its sub-commands
(``commands``), parsing of the training commands' flags (``parse``), their
``--help`` (``help``) and the generated reference (``reference``)."""
