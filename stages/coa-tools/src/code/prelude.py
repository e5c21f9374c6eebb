# coa-tools sandbox harness, run as `python3 -s -B -c <this> main.py ENDING FD` in the run's dir.
#
# 1. Reads the run's token (and the unit tests, if any) from descriptor FD, an in-memory file,
#    and closes it: the program never sees either in a file, an argument or the environment.
# 2. Installs two audit hooks. The first refuses writes outside the working directory (defence
#    in depth, for runs without a private /tmp) and the features that could dig the token out of
#    the harness: gc introspection, trace, profile and monitoring hooks, raw memory access
#    through ctypes, /proc/*/mem. The second holds the token in its closure (Python cannot list
#    audit hooks) and never raises, so its frame never shows up in a traceback.
# 3. Runs main.py as `python3 main.py` would (as __main__), then the tests, compiled on their own,
#    in the same namespace.
# 4. If the program reached its end, prints "\n<token>\n": ENDING `last-statement` means the last
#    statement of main.py and of the tests ran; `clean-exit` also accepts sys.exit() with 0 or
#    None. Only _coa_run's own code can make the second hook print it, and only once.
# Everything lives inside functions that delete themselves, so __main__ starts clean.


def _coa_end_hook(token, run_code, write, getframe):
    def end(event, args):
        nonlocal token
        if event != 'coa.sandbox.end' or token is None:
            return
        try:
            if getframe(1).f_code is run_code:
                line, token = b'\n' + token + b'\n', None
                write(1, line)
        except BaseException:
            pass
    return end


def _coa_hook(run_code):
    import os, sys
    realpath, isabs, join, fsdecode, getcwd, readlink = (
        os.path.realpath, os.path.isabs, os.path.join, os.fsdecode, os.getcwd, os.readlink)
    fd = int(sys.argv[3])
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    token, _, tests = b''.join(chunks).partition(b'\n')
    root = realpath(getcwd())
    prefix = root + os.sep
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path, dir_fd):
        if isinstance(path, int):  # an fd the code already holds
            return True
        path = fsdecode(path)
        if not isabs(path):
            base = getcwd() if dir_fd is None or dir_fd < 0 else readlink('/proc/self/fd/%d' % dir_fd)
            path = join(base, path)
        path = realpath(path)
        return path == root or path.startswith(prefix)

    # audit event -> ((path arg, dir_fd arg or None), ...) of the paths it modifies
    checks = {
        'open': ((0, None),), 'os.remove': ((0, 1),), 'os.rmdir': ((0, 1),),
        'os.mkdir': ((0, 2),), 'os.rename': ((0, 2), (1, 3)), 'os.link': ((0, 2), (1, 3)),
        'os.symlink': ((1, 2),), 'os.truncate': ((0, None),), 'os.chmod': ((0, 2),),
        'os.chown': ((0, 3),), 'os.utime': ((0, 3),), 'os.setxattr': ((0, None),),
        'os.removexattr': ((0, None),), 'shutil.rmtree': ((0, 1),),
    }
    # Each of these could reach the token in the end hook's closure.
    refused = frozenset((
        'gc.get_objects', 'gc.get_referrers', 'gc.get_referents', 'sys.settrace', 'sys.setprofile',
        'sys.monitoring.register_callback', 'ctypes.string_at', 'ctypes.wstring_at', 'ctypes.cdata',
        'ctypes.call_function',
    ))

    def guard(event, args):
        if event in refused:
            raise RuntimeError('sandbox: %s is not available here' % event)
        if event == 'open' and isinstance(args[0], (str, bytes)):
            p = fsdecode(args[0])
            if p.startswith('/proc/') and p.rstrip('/').endswith('/mem'):
                raise PermissionError(13, 'sandbox: reading process memory is not allowed', p)
        spec = checks.get(event)
        if spec is None or (event == 'open' and not (args[2] or 0) & writes):
            return
        for p, d in spec:
            if not inside(args[p], None if d is None else args[d]):
                raise PermissionError(13, 'sandbox: writing outside the working directory is not allowed', fsdecode(args[p]))

    sys.addaudithook(guard)
    sys.addaudithook(_coa_end_hook(token, run_code, os.write, sys._getframe))
    return root, tests.decode('utf-8')


def _coa_run():
    import linecache, sys
    audit, stdout = sys.audit, sys.stdout
    root, tests = _coa_hook(sys._getframe(0).f_code)
    clean_exit = sys.argv[2] == 'clean-exit'
    # Run main.py as `python3 main.py` would: as __main__, with argv and path[0] to match.
    # The fixed relative file name keeps tracebacks identical from run to run.
    name = sys.argv[1]
    with open(name, encoding='utf-8') as f:
        source = f.read()
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    sys.argv = sys.argv[1:2]
    sys.path.insert(0, root)
    main = sys.modules['__main__'].__dict__
    del main['_coa_run'], main['_coa_hook'], main['_coa_end_hook']
    main['__file__'] = name
    try:
        exec(compile(source, name, 'exec'), main)
        if tests:
            exec(compile(tests, 'tests.py', 'exec'), main)
    except SystemExit as e:
        code = e.code
        if not (clean_exit and (code is None or (type(code) in (int, bool) and code == 0))):
            raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        # Report as the interpreter would, minus this harness's frame.
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
    try:
        stdout.flush()
    except BaseException:
        pass
    audit('coa.sandbox.end')


_coa_run()
