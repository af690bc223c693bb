import sys

from iotfraud.cli import main

sys.exit(main())
