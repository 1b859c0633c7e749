"""The layout the README's map promises, checked from the code: the top level a student opens, imports that read
downward (model files import no support code, support code no study), one way to open a checkpoint, and the
torch version the docs name being one that has what the code imports."""
import ast
import re
import subprocess

import pytest

from conftest import ROOT

TOP_LEVEL = {'README.md', 'model.py', 'attention.py', 'rules', 'vit.py', 'train.py', 'sample.py', 'bench.py', 'configurator.py',
             'machinery', 'prepare', 'config', 'tests', 'docs', 'support', 'studies', 'requirements.txt',
             'requirements-extras.txt', 'pytest.ini', '.ci', '.gitignore'}
MODEL_FILES = ('model.py', 'attention.py', 'vit.py')
RULE_IMPORTS = {'attention', 'machinery', 'torch', 'numpy', 'math', 'dataclasses', 'functools'}  # a rule file's


def tracked(pattern='*'):
    out = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', pattern], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split() if (ROOT / p).is_file()]  # a deletion not yet staged is gone


def imported(path):
    """The top-level names of the repo modules a file imports ('support', 'studies', 'model', ...)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split('.')[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def test_the_top_level_is_the_card():
    top = {p.relative_to(ROOT).parts[0] for p in tracked()}
    assert top <= TOP_LEVEL, f"not on the card: {sorted(top - TOP_LEVEL)}"


def test_imports_read_downward():
    for path in [ROOT / name for name in MODEL_FILES] + tracked('rules/*.py'):
        assert not imported(path) & {'support', 'studies', 'train', 'sample', 'bench'}, path
    assert imported(ROOT / 'attention.py') <= {'machinery', 'torch', 'math', 'dataclasses'}  # the frame: no numpy
    for path in tracked('support/*.py') + tracked('prepare/*.py'):
        assert 'studies' not in imported(path), path
    for path in tracked('prepare/*.py'):  # the data's floor: support and the scripts build on it, never the reverse
        assert not imported(path) & {'support', 'model', 'attention', 'rules', 'vit', 'train', 'sample'}, path
    for path in tracked('machinery/*.py'):  # the bottom: what the rules are built from knows no rule and no script
        assert imported(path) <= {'machinery', 'torch', 'numpy', 'warnings', 'functools', 'math', 'os', 'triton'}, path
        if 'triton' in imported(path):  # the optional extra: only the kernels' room names it
            assert path.parent.name == 'kernels', path


def test_a_rule_file_imports_the_frame_and_the_machinery_only():
    """rules/<key>.py: attention.py (the frame, softmax, the row-weights frame), machinery/, torch, numpy and the
    standard library at its top, never another rule, and nothing below the top (the registry hands the mix its
    rule)."""
    for path in tracked('rules/*.py'):
        tree = ast.parse(path.read_text())
        top = {node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
        names = set()
        for node in top:
            names |= {node.module.split('.')[0]} if isinstance(node, ast.ImportFrom) else \
                {a.name.split('.')[0] for a in node.names}
        if path.name == '__init__.py':  # the registry: the frame, and every rule
            assert names <= RULE_IMPORTS | {'rules'}, path
            continue
        assert names <= RULE_IMPORTS, (path, names - RULE_IMPORTS)
        late = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node not in top}
        assert not late, (path, late)


def test_the_frame_is_short_and_softmax_comes_first():
    lines = (ROOT / 'attention.py').read_text().splitlines()
    assert len(lines) <= 500
    assert lines.index('class SoftmaxAttention(Attention):') < lines.index('    def attend(self, q, k, v):', 120) < 200


@pytest.mark.parametrize('name', ['attention.py'] + [f'rules/{p.name}' for p in sorted((ROOT / 'rules').glob('*.py'))])
def test_each_file_reads_top_down(name):
    """The math first: a module-level name is used before its definition only by the code it helps, at most a
    rule's length above it; the machinery is imported at the top, not defined below."""
    tree = ast.parse((ROOT / name).read_text())
    defined = {}
    for node in tree.body:
        names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
            [t.id for t in getattr(node, 'targets', []) if isinstance(t, ast.Name)]
        for defined_name in names:
            defined.setdefault(defined_name, node.lineno)
    early = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in defined and
             defined[n.id] - n.lineno > 150}
    assert not early, f"used far above their definition: {sorted(early)}"
    assert not {'Rotary', 'KVCache', 'band_keys', 'block_mask'} & set(defined)


def test_a_checkpoint_is_opened_in_one_place():
    opened = [p.relative_to(ROOT).as_posix() for p in tracked('*.py')
              if 'tests' not in p.parts and re.search(r"\btorch\.load\(", p.read_text())]
    assert opened == ['support/loading.py'], opened


def test_readme_and_train_stay_short():
    assert len((ROOT / 'README.md').read_text().splitlines()) <= 250
    assert len((ROOT / 'train.py').read_text().splitlines()) <= 420


def test_the_torch_the_docs_name_has_what_the_code_imports():
    """rules/tda.py imports flex_attention's AuxRequest, which torch 2.9 introduced: the README's install line and
    requirements.txt must not promise an older torch (they said >= 2.5)."""
    assert 'AuxRequest' in (ROOT / 'rules' / 'tda.py').read_text()
    lowest = re.search(r"^torch>=([\d.]+)$", (ROOT / 'requirements.txt').read_text(), re.M).group(1)
    assert tuple(map(int, lowest.split('.'))) >= (2, 9)
    assert f"torch: any >= {lowest}" in (ROOT / 'README.md').read_text()


def test_the_studies_import_no_loop():
    """No module of studies/ imports, at its top or in a function, one that imports it back (launch.py is handed
    the lab's functions for a job, never imports the lab)."""
    graph = {}
    for path in tracked('studies/*.py'):
        modules = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or '').startswith('studies.'):
                modules.add(node.module.split('.')[1])
            elif isinstance(node, ast.ImportFrom) and node.module == 'studies':
                modules |= {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                modules |= {a.name.split('.')[1] for a in node.names if a.name.startswith('studies.')}
        graph[path.stem] = modules

    def reach(name, seen=()):
        """The modules `name` imports, itself or through others."""
        found = set()
        for module in graph.get(name, set()) - set(seen):
            found |= {module} | reach(module, (*seen, module))
        return found
    looped = sorted(name for name in graph if name in reach(name))
    assert not looped, looped
    assert not graph['launch'], graph['launch']
