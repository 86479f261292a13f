import sys

from torchneuron.cli import main

sys.exit(main())
