import sys

from elasticd.keeper.main import main

sys.exit(main())
