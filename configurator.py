"""
Poor Man's Configurator, as in nanoGPT. Exec'd from a script's globals, not imported:

$ python train.py config/override_file.py --batch_size=32

The config file is plain Python that assigns existing globals; each --key=value overrides one of them.
A config builds on another with exec(open(os.path.join(os.path.dirname(__file__), 'other.py')).read()).
Unlike nanoGPT, an unknown key (with a "did you mean": a renamed key's new name), a value of the wrong type or a
config file that does not run (a syntax error) stops the run with one `error:` line; so does a number that is not one:
an infinite or NaN float (unless the key's default is one), a whole number past 64 bits, or a seed torch and numpy
cannot take (0 .. 2**63 - 1). A path setting (a key ending in _dir, _root, _source or _path, and init_from, png,
plots) that starts with ~ is in the home folder, as a shell would give it: the shell expands ~ only at the start of a
word, so --out_dir=~/x arrives as typed.
"""
import builtins as _builtins
import difflib as _difflib
import math as _math
import os as _os
from ast import literal_eval as _literal_eval

_config_types = (int, float, bool, str, type(None))
_INT64 = 2 ** 63  # a whole number torch and numpy hold: sizes, counts, seeds
_PATH_KEYS = ('_dir', '_root', '_source', '_path', 'init_from', 'png', 'plots')  # the settings naming files, by name
_keys = {k: v for k, v in globals().items() if not k.startswith('_') and isinstance(v, _config_types)}
overridden = set()  # the keys a config file changed or --key=value gave (a fine-tune takes its base's for the rest)
typed = set()  # of those, the keys --key=value gave (a rule's own key, typed for another rule, is refused)
# keys renamed since, old -> today's: the "did you mean" of an old key, which is refused, never read as the new one
# (its meaning may have changed with its name: krause_mix mixed Krause alone)
_RENAMED = {'cluster_block': 'cluster_chunk', 'krause_mix': 'mix', 'image_tokens': 'subpixels',
            **dict.fromkeys(('tda_chunk', 'tda_chunk_weights', 'topk_chunk_weights', 'entmax_chunk_weights',
                             'rela_chunk_weights'), 'tile_weights')}


def _config_error(msg):
    from support.runtime import exit_with_error  # every process of a torchrun meets it: said once
    exit_with_error(msg)


def _run_config(source, path, scope):
    """exec a config file; a syntax error or an exception in it is one line naming the file and line."""
    try:
        exec(_builtins.compile(source, path, 'exec'), scope)  # train.py's `compile` is a config key
    except SyntaxError as e:
        _config_error(f"{e.filename}, line {e.lineno}: {e.msg}; fix the config file")
    except Exception as e:
        import traceback
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path] or [None]
        where = f"{path}, line {frames[-1].lineno}" if frames[-1] else path
        _config_error(f"{where}: {type(e).__name__}: {e}; fix the config file")


def _checked(key, value, where):
    if key not in _keys:
        hint = [_RENAMED[key]] if _RENAMED.get(key) in _keys else _difflib.get_close_matches(key, _keys, n=1)
        _config_error(f"unknown key '{key}' in {where}" + (f"; did you mean '{hint[0]}'?" if hint else
                      f"; valid keys: {', '.join(sorted(_keys))}"))
    default = _keys[key]
    if type(default) is float and type(value) is int:
        try:
            value = float(value)  # --learning_rate=1 means 1.0
        except OverflowError:
            _config_error(f"{key} must be a finite number, got {value} in {where}; pass e.g. --{key}={default!r}")
    if default is not None and type(value) is not type(default):
        _config_error(f"{key} expects {type(default).__name__} (like {default!r}), got {value!r} in {where}")
    if type(value) is str and key.endswith(_PATH_KEYS):  # each of several comma-separated paths (analyze.py's)
        value = ','.join(_os.path.expanduser(part) for part in value.split(','))
    return _number(key, value, default, where)


def _number(key, value, default, where):
    """value, or one line naming the key where it is no number a run can use."""
    if type(value) is float and not _math.isfinite(value) and _math.isfinite(default or 0.0):
        _config_error(f"{key} must be a finite number, got {value} in {where}; pass e.g. --{key}={default!r}")
    if type(value) is int and not -_INT64 <= value < _INT64:
        _config_error(f"{key}={value} in {where} is past 64 bits (the most is 2**63 - 1); pass e.g. "
                      f"--{key}={default!r}")
    if key == 'seed' and type(value) is int and value < 0:  # numpy's generators take none
        _config_error(f"seed must be in 0 .. 2**63 - 1, got {value} in {where}; pass e.g. --seed={default!r}")
    return value


def _comments():
    """{key: the comment beside its first assignment}, read from the script's source, then from the sources of the
    repo modules it imported, top level and rules/ (the model dataclasses' keys: `window: int = 0  # ...`)."""
    import io, os, sys, tokenize
    here = os.path.dirname(os.path.abspath(__file__))
    modules = (getattr(m, '__file__', None) or '' for m in list(sys.modules.values()))
    homes = (here, os.path.join(here, 'rules'))  # the top-level modules, and each rule's file (its keys)
    files = [os.path.abspath(__file__)] + sorted(f for f in modules if os.path.isabs(f) and os.path.dirname(f) in homes)
    comments = {}
    for path in files:
        line_start = {}  # line number -> the name that starts it, when it is `name =` or `name: type =`
        with open(path, encoding='utf-8') as f:
            for tok in tokenize.generate_tokens(io.StringIO(f.read()).readline):
                row = tok.start[0]
                if tok.type == tokenize.NAME and row not in line_start and tok.line[:tok.start[1]].strip() == '':
                    rest = tok.line[tok.end[1]:].lstrip()
                    line_start[row] = tok.string if rest[:1] in (':', '=') and rest[:2] != '==' else None
                elif tok.type == tokenize.COMMENT and line_start.get(row) in _keys:
                    comments.setdefault(line_start[row], tok.string.lstrip('# '))
    return comments


def _help():
    """Print the keys, their defaults and comments, and exit; a reader that stops early (`| head`) ends it quietly."""
    import os, sys
    try:
        print(f"usage: python {sys.argv[0]} [config/x.py ...] [--key=value ...]; keys and defaults:")
        lines = [f"  --{k}={v if not isinstance(v, str) or v.isprintable() else repr(v)}" for k, v in _keys.items()]
        notes, width = _comments(), max(map(len, lines))
        print('\n'.join(f"{line:<{width}}  # {notes[k]}" if k in notes else line for line, k in zip(lines, _keys)))
        sys.stdout.flush()
    except BrokenPipeError:  # the reader has what it wanted; what is left unwritten goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(0)


for _arg in __import__('sys').argv[1:]:
    if _arg in ('-h', '--help'):
        _help()
    if not _arg.startswith('--'):  # a config file
        try:
            _source = open(_arg, encoding='utf-8').read()
        except OSError as _e:
            _config_error(f"cannot read config file {_arg}: {_e.strerror}; arguments are config/x.py or --key=value")
        except UnicodeDecodeError as _e:  # a binary file, or text in another encoding
            _config_error(f"config file {_arg} is not UTF-8 text (byte {_e.start}: {_e.reason}); a config file is "
                          f"Python that assigns keys, e.g. config/x.py")
        _scope = dict(_keys, __file__=_arg)  # a config may exec another beside it, found through its __file__
        _run_config(_source, _arg, _scope)
        for _key, _val in _scope.items():
            if _key.startswith('_') or _key == '__builtins__' or type(_val).__name__ == 'module':
                continue
            if _key not in _keys or _val is not _keys[_key]:
                globals()[_key] = _keys[_key] = _checked(_key, _val, _arg)
                overridden.add(_key)
        print(f"Overriding config with {_arg}")
    else:
        if '=' not in _arg:
            _config_error(f"'{_arg}' has no value; write --key=value")
        _key, _val = _arg[2:].split('=', 1)
        if not isinstance(_keys.get(_key), str) or _val[:1] in '\'"':  # a str key takes the text as it is
            try:
                _val = _literal_eval(_val)  # numbers, booleans, None, quoted strings
            except (SyntaxError, ValueError):
                pass                        # anything else is a plain string
        _val = globals()[_key] = _keys[_key] = _checked(_key, _val, f"--{_key}")
        overridden.add(_key)
        typed.add(_key)
        print(f"Overriding: {_key} = {_val}")
