import sys

from unirl.cli import main

sys.exit(main())
