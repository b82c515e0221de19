import sys

from querylib.cli import main

sys.exit(main())
