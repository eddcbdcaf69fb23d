"""What every part of fastpbrl shares and nothing of fastpbrl's below it:
the data types (``types``), search spaces (``search_space``), random
generator state (``rng``), settings files (``settings_file``) and the
import of user code named on the command line (``imports``)."""
