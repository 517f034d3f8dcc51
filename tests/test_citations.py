"""The code cites what its readers have: the papers (equation, algorithm, table) and this
repository's own files. A citation of a document that is not in the repository (a
development note, a specification kept elsewhere) or of a repository path that does not
exist fails here."""
import glob
import os.path as osp
import re

from conftest import ROOT

# Where code and its comments live: the library, the tools, the tests, the scripts, the
# configs and the packaging.
SOURCES = sorted(
    f for pattern in ('mmsoft/**/*.py', 'tools/**/*.py', 'tools/**/*.sh', 'tests/**/*.py',
                      'scripts/**/*.py', 'scripts/**/*.sh', 'configs/**/*.py', 'setup.py',
                      '.ci/*')
    for f in glob.glob(pattern, root_dir=ROOT, recursive=True)
    if osp.isfile(osp.join(ROOT, f)))

# Documents that are not in the repository: the design specification kept outside it
# (named as a word in capitals, or by its file name) and anything in a folder beside the
# repository.
ABSENT_DOCUMENT = re.compile(r'\bSPEC\b|SPEC\.md|\.\./shared/')
# A path into the repository's own top-level folders, with a file extension.
REPO_PATH = re.compile(r'(?<![\w./-])((?:mmsoft|tools|tests|docs|configs|scripts)/'
                       r'[\w./-]*\w\.(?:md|py|sh|json|yml|pth|txt))\b')
# The docs test writes missing paths on purpose, to show that they are reported: its
# paths are data, not citations.
PATHS_AS_DATA = {'tests/test_docs.py'}


def citations(path):
    """(line number, kind, text) for every citation in ``path`` that has no target."""
    here = __file__ if osp.isabs(__file__) else osp.join(ROOT, __file__)
    if osp.samefile(osp.join(ROOT, path), here):
        return []  # this file names the patterns it looks for
    text = open(osp.join(ROOT, path), encoding='utf-8').read()
    found = []
    for number, line in enumerate(text.split('\n'), 1):
        for m in ABSENT_DOCUMENT.finditer(line):
            found.append((number, 'a document not in the repository', m.group(0)))
        for m in REPO_PATH.finditer(line):
            target = m.group(1).rstrip('.')
            if '*' in target or path in PATHS_AS_DATA:
                continue
            if not osp.exists(osp.join(ROOT, target)):
                found.append((number, 'a path that does not exist', target))
    return found


def test_sources_are_found():
    assert 'mmsoft/models/attention/soft.py' in SOURCES and 'tools/train.py' in SOURCES
    assert len(SOURCES) > 50


def test_no_citation_of_a_missing_document():
    problems = [f'{path}:{number}: {kind}: {text}' for path in SOURCES
                for number, kind, text in citations(path)]
    assert not problems, '\n'.join(problems)


def test_missing_citations_are_found(tmp_path, monkeypatch):
    """The check itself: a specification cited by name, and a repository path that does
    not exist, are both reported; an existing path is not."""
    import test_citations as me
    source = tmp_path / 'mmsoft' / 'example.py'
    source.parent.mkdir()
    source.write_text('# the step size (SPEC 1.1)\n'
                      '# measured in docs/en/notes/gone.md, tested in tests/conftest.py\n')
    (tmp_path / 'tests').mkdir()
    (tmp_path / 'tests' / 'conftest.py').write_text('')
    monkeypatch.setattr(me, 'ROOT', str(tmp_path))
    assert me.citations('mmsoft/example.py') == [
        (1, 'a document not in the repository', 'SPEC'),
        (2, 'a path that does not exist', 'docs/en/notes/gone.md')]
