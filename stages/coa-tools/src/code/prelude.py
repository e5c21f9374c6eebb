# coa-tools sandbox harness, run as `python3 -s -B -c <plain.py + this> main.py ENDING FD [IN OUT]`
# in the run's dir.
#
# 1. Reads the run's token (and the unit tests, if any) from descriptor FD, an in-memory file,
#    and closes it: the program never sees either in a file, an argument or the environment.
# 2. Installs three audit hooks. `guard` refuses writes outside the working directory (defence
#    in depth, for runs without a private /tmp) and the features that could dig the token out of
#    the harness: gc introspection, trace, profile and monitoring hooks, ctypes and cffi,
#    /proc/<pid>/mem (paths resolved: cwd, symlinks) and directory descriptors outside the
#    working directory (os.open's dir_fd is not in its audit event). `runner` runs
#    the tests; `witness` holds the token in its closure (Python cannot list audit hooks).
# 3. Runs main.py as `python3 main.py` would (as __main__); then the runner hook, called from
#    _coa_run's own frame, runs the tests, compiled on their own, in the same namespace.
# 4. If the program reached its end, the witness prints "\n<token>\n": ENDING `last-statement`
#    means the last statement of main.py and of the tests ran; `clean-exit` also accepts
#    sys.exit() with 0 or None (the tests, if any, still run). Only the one runner frame that
#    _coa_run started can make the witness print it, and only once, after the tests returned.
# 5. With IN and OUT (the driver: see _coa_serve), once main.py ran to its end, answers calls
#    read from descriptor IN with plain values written to OUT, until IN ends.
# Everything lives inside functions that delete themselves, so __main__ starts clean.


def _coa_end_hooks(token, tests, clean_exit, run_frame, main, getframe, write, flush, audit):
    # Two hooks. `runner` runs the tests once _coa_run's own frame (`run_frame`, the frame
    # object, not just its code: a program can exec that code in a new frame) says the program
    # ended, and holds no token: code called by the tests can reach its frame. `witness`
    # holds the token, calls nothing the program controls and never raises, so no frame of the
    # program's ever sees its frame. It prints the token for the one runner frame that
    # presented `secret` first (only the real runner has it before the tests run) once that
    # frame reports the tests passed.
    secret, runner_frame = object(), None
    exec_, compile_, type_, int_, bool_ = exec, compile, type, int, bool

    def witness(event, args):
        nonlocal token, runner_frame
        if token is None or (event != 'coa.sandbox.begin' and event != 'coa.sandbox.pass'):
            return
        try:
            caller = getframe(1)
            if event == 'coa.sandbox.begin':
                if runner_frame is None and len(args) == 1 and args[0] is secret and caller.f_back is run_frame:
                    runner_frame = caller
            elif runner_frame is not None and caller is runner_frame:
                line, token = b'\n' + token + b'\n', None
                write(1, line)
        except BaseException:
            pass

    def runner(event, args):
        nonlocal tests
        if event != 'coa.sandbox.end' or tests is None or getframe(1) is not run_frame:
            return
        source, tests = tests, None
        audit('coa.sandbox.begin', secret)
        exited, status = args
        if exited and not (clean_exit and (status is None or (type_(status) in (int_, bool_) and status == 0))):
            return
        if source:
            exec_(compile_(source, 'tests.py', 'exec'), main)
        try:
            flush()
        except BaseException:
            pass
        audit('coa.sandbox.pass')

    return runner, witness


def _coa_hook(run_frame):
    import os, sys
    realpath, isabs, isdir, join, fsdecode, getcwd, readlink = (
        os.path.realpath, os.path.isabs, os.path.isdir, os.path.join, os.fsdecode, os.getcwd,
        os.readlink)
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

    def process_memory(path):
        # /proc/<pid>/mem or /proc/<pid>/task/<tid>/mem, once self and thread-self resolve.
        parts = path.split('/')
        return parts[1:2] == ['proc'] and parts[-1] == 'mem' and (
            len(parts) == 4 or (len(parts) == 6 and parts[3] == 'task'))

    def resolve(path, dir_fd):
        path = fsdecode(path)
        if not isabs(path):
            base = getcwd() if dir_fd is None or dir_fd < 0 else readlink('/proc/self/fd/%d' % dir_fd)
            path = join(base, path)
        return realpath(path)

    def inside(path):
        return path == root or path.startswith(prefix)

    # audit event -> ((path arg, dir_fd arg or None), ...) of the paths it modifies
    checks = {
        'open': ((0, None),), 'os.remove': ((0, 1),), 'os.rmdir': ((0, 1),),
        'os.mkdir': ((0, 2),), 'os.rename': ((0, 2), (1, 3)), 'os.link': ((0, 2), (1, 3)),
        'os.symlink': ((1, 2),), 'os.truncate': ((0, None),), 'os.chmod': ((0, 2),),
        'os.chown': ((0, 3),), 'os.utime': ((0, 3),), 'os.setxattr': ((0, None),),
        'os.removexattr': ((0, None),), 'shutil.rmtree': ((0, 1),),
    }
    # Each of these could reach the token in the witness hook's closure.
    refused = frozenset((
        'gc.get_objects', 'gc.get_referrers', 'gc.get_referents', 'sys.settrace', 'sys.setprofile',
        'sys.monitoring.register_callback', 'ctypes.string_at', 'ctypes.wstring_at', 'ctypes.cdata',
        'ctypes.call_function',
    ))

    # Foreign function interfaces: a call into libc (write, memcpy) reads any memory, and
    # Python audits only some of ctypes' entry points. Refused as an ImportError, which
    # libraries with optional ctypes support expect.
    foreign = frozenset(('_ctypes', '_cffi_backend'))

    def guard(event, args):
        if event in refused:
            raise RuntimeError('sandbox: %s is not available here' % event)
        if event == 'import' and isinstance(args[0], str) and str.__str__(args[0]) in foreign:
            raise ImportError('sandbox: ctypes is not available here')
        spec = checks.get(event)
        if spec is None or isinstance(args[0], int):  # an fd the code already holds
            return
        if event == 'open':
            # The event does not carry os.open's dir_fd, so a path is resolved against the
            # working directory; a directory outside the working directory may not become an
            # fd, so no dir_fd can lead from elsewhere to /proc/<pid>/mem.
            path = resolve(args[0], None)
            if process_memory(path):
                raise PermissionError(13, 'sandbox: reading process memory is not allowed', fsdecode(args[0]))
            if not inside(path) and isdir(path) and args[1] is None:
                raise PermissionError(13, 'sandbox: directories outside the working directory cannot be opened as descriptors', fsdecode(args[0]))
            if not (args[2] or 0) & writes:
                return
        for p, d in spec:
            if not isinstance(args[p], int) and not inside(resolve(args[p], None if d is None else args[d])):
                raise PermissionError(13, 'sandbox: writing outside the working directory is not allowed', fsdecode(args[p]))

    runner, witness = _coa_end_hooks(
        token, tests.decode('utf-8'), sys.argv[2] == 'clean-exit', run_frame,
        sys.modules['__main__'].__dict__, sys._getframe, os.write, sys.stdout.flush, sys.audit)
    sys.addaudithook(guard)
    sys.addaudithook(runner)
    sys.addaudithook(witness)
    return root


def _coa_serve(main, rfd, wfd, enc):
    # The driver: one call a line as Python literal text, ([name] or [class, method], (args),
    # {kwargs}) (plain.py's `lit`), calls `name(*args, **kwargs)` or `class().method(...)` in
    # main.py's namespace and answers {"v": value} or {"e": "Type: message"} (plain.py's JSON) on
    # a line of its own. It runs in the candidate's process, so the candidate can change what it
    # answers: that is no more than returning another value. The verdict is decided by whoever
    # reads OUT (the grader or a checker process), which never runs code of this process and
    # holds the expected values and tests that never come here.
    import os
    write, type_, str_, eval_, getattr_ = os.write, type, str, eval, getattr
    names = {'__builtins__': {}, 'set': set, 'frozenset': frozenset, 'inf': float('inf'), 'nan': float('nan')}
    requests = open(rfd, 'rb')

    def answer(line):
        try:
            path, args, kwargs = eval_(line, dict(names))
            target = main[path[0]]
            if len(path) == 2:
                target = getattr_(target(), path[1])
            return '{"v":%s}' % enc(target(*args, **kwargs))
        except BaseException as e:
            try:
                text = '%s: %s' % (type_(e).__name__, str_(e))
            except BaseException:
                text = 'an exception that cannot be shown'
            return '{"e":%s}' % enc(text[:2000])

    for line in requests:
        data = (answer(line) + '\n').encode()
        while data:
            data = data[write(wfd, data):]


def _coa_run():
    import sys
    audit = sys.audit
    enc = _coa_plain()[0]
    serve = sys.argv[4:6]
    root = _coa_hook(sys._getframe(0))
    # Run main.py as `python3 main.py` would: as __main__, with argv and path[0] to match.
    # The fixed relative file name keeps tracebacks identical from run to run; their source
    # lines are read from main.py (found through path[0] after a chdir). No linecache entry:
    # importing linecache (tokenize, re) would cost every run about 9 ms.
    name = sys.argv[1]
    with open(name, encoding='utf-8') as f:
        source = f.read()
    sys.argv = sys.argv[1:2]
    sys.path.insert(0, root)
    main = sys.modules['__main__'].__dict__
    del main['_coa_run'], main['_coa_hook'], main['_coa_end_hooks'], main['_coa_plain']
    serve_calls = main.pop('_coa_serve')
    main['__file__'] = name
    try:
        try:
            exec(compile(source, name, 'exec'), main)
        except SystemExit as e:
            # The runner hook decides whether this exit is an end (and then runs the tests).
            audit('coa.sandbox.end', True, e.code)
            raise
        audit('coa.sandbox.end', False, None)
        if serve:
            serve_calls(main, int(serve[0]), int(serve[1]), enc)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        # Report as the interpreter would, minus this harness's frames.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == '<string>':
            tb = tb.tb_next
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        sys.exit(1)


_coa_run()
