"""
What every prepare script's command line shares: its whole-number settings (whole_number, an argparse type) and
its errors, each one `error:` line instead of a traceback (script_errors).
"""
import sys
from contextlib import contextmanager


def whole_number(key, example, at_least=0, at_most=2 ** 63 - 1):
    """An argparse type for --key: a whole number in [at_least, at_most] (1e9 reads as 10**9); anything else ends
    the script with one `error:` line naming the key, before any work."""
    def parse(text):
        try:
            number = float(text)
            value = int(text) if text.strip().lstrip('+-').isdigit() else int(number) if number.is_integer() else None
        except ValueError:  # not a number at all
            value = None
        if value is None or not at_least <= value <= at_most:
            raise SystemExit(f"error: --{key}={text} must be a whole number from {at_least} to {at_most:,}; pass e.g. "
                             f"--{key}={example}")
        return value
    return parse


@contextmanager
def script_errors():
    """A prepare script's own run: a bad --source or no network (OSError, RuntimeError, ValueError) is one `error:`
    line; Ctrl-C too, exit code 130 (every write is atomic, meta.json last: nothing half-written is left)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); no temporary file is left, and meta.json (written last) says what is "
              "prepared; run it again", file=sys.stderr)
        raise SystemExit(130) from None
