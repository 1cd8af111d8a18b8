"""python -m elasticd.ctl: elasticctl."""

import sys

from elasticd.ctl.commands import main

sys.exit(main())
