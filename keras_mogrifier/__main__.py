"""`python -m keras_mogrifier`: the command line (`keras_mogrifier.cli`)."""

import sys

from keras_mogrifier.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m keras_mogrifier"))
