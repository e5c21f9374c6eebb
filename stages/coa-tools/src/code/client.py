# The checker's half of the driver (prelude.py's _coa_serve): test code that cannot be reduced to
# (arguments, expected value) pairs runs in a process of its own, the checker, where each name
# the tests take from the program (the entry point, its helpers) is a function that sends the
# call to the candidate's run and returns the plain value it answered (plain.py), or raises the
# builtin exception it raised (RuntimeError for any other). The checker and the candidate share
# no memory: a returned object's __eq__, patched builtins or modules, frames and audit hooks of
# the candidate all stay in the candidate's process.


def _coa_client(rfd, wfd, names, g):
    import builtins, json, os
    _, dec, lit = _coa_plain()
    replies = open(rfd, 'rb')
    loads, write = json.loads, os.write

    def call(name, args, kwargs):
        data = (lit([name], args, kwargs) + '\n').encode()
        while data:
            data = data[write(wfd, data):]
        reply = replies.readline()
        if not reply:
            raise RuntimeError('the program under test is gone (it exited, crashed or was killed)')
        reply = loads(reply)
        if 'e' not in reply:
            return dec(reply['v'])
        text = dec(reply['e'])
        name, _, message = text.partition(': ')
        cls = getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                error = cls(message)
            except Exception:
                error = RuntimeError(text)
        else:
            error = RuntimeError(text)
        raise error

    def remote(name):
        def forward(*args, **kwargs):
            return call(name, args, kwargs)
        forward.__name__ = forward.__qualname__ = name
        return forward

    for name in names:
        if name not in g:
            g[name] = remote(name)


_coa_client(*_coa_channel, globals())
del _coa_client, _coa_plain, _coa_channel
