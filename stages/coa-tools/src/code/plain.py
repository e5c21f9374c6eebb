# Plain values across a process boundary: the one encoding the sandbox's driver, the checker's
# proxies and the test planner share, and that `value.rs` decodes. Only None, bool, int, float,
# str, bytes and lists, tuples, dicts, sets (frozensets) of these cross; anything else (a
# subclass, an object with its own __eq__, a generator) is refused, so no code of one process
# ever runs in another. JSON text, built here without the json module (whose import, with `re`,
# costs a sandboxed run more than its program): None and bools as themselves; {"i": "<decimal>"},
# {"f": "<repr>"}, {"u": "<hex of UTF-8>"}, {"b": "<hex>"}, {"l": [...]}, {"t": [...]},
# {"s": [...]}, {"d": [[k, v], ...]}. Types are compared with `is` on the exact type:
# `type(x) is int` is false for a bool or a subclass of int. Calls go the other way as Python
# literal text (`lit`), read with `eval` and no builtins by the driver.


def _coa_plain():
    import sys
    if hasattr(sys, 'set_int_max_str_digits'):
        sys.set_int_max_str_digits(0)  # big ints cross whole
    NoneType, list_, tuple_, dict_, set_, frozenset_ = type(None), list, tuple, dict, set, frozenset
    int_, float_, str_, bytes_, bool_, type_, repr_ = int, float, str, bytes, bool, type, repr
    join = ','.join

    def enc(v):
        t = type_(v)
        if t is NoneType:
            return 'null'
        if t is bool_:
            return 'true' if v else 'false'
        if t is int_:
            return '{"i":"%s"}' % int_.__repr__(v)
        if t is float_:
            return '{"f":"%s"}' % float_.__repr__(v)
        if t is str_:
            return '{"u":"%s"}' % str_.encode(v, 'utf-8', 'surrogatepass').hex()
        if t is bytes_:
            return '{"b":"%s"}' % bytes_.hex(v)
        if t is list_:
            return '{"l":[%s]}' % join([enc(x) for x in list_.__iter__(v)])
        if t is tuple_:
            return '{"t":[%s]}' % join([enc(x) for x in tuple_.__iter__(v)])
        if t is set_ or t is frozenset_:
            return '{"s":[%s]}' % join([enc(x) for x in t.__iter__(v)])
        if t is dict_:
            return '{"d":[%s]}' % join(['[%s,%s]' % (enc(k), enc(x)) for k, x in dict_.items(v)])
        raise TypeError('not a plain value: %s (only None, bool, int, float, str, bytes and lists, tuples, dicts, sets of them)' % t.__name__)

    def dec(j, key=False):
        # `j` as json.loads read enc's text.
        if j is None or type_(j) is bool_:
            return j
        if type_(j) is not dict_ or len(j) != 1:
            raise ValueError('not an encoded plain value')
        (tag, x), = j.items()
        if tag == 'i':
            return int_(x)
        if tag == 'f':
            return float_(x)
        if tag == 'u':
            return bytes_.fromhex(x).decode('utf-8', 'surrogatepass')
        if tag == 'b':
            return bytes_.fromhex(x)
        if tag == 'l':
            return [dec(e) for e in x]
        if tag == 't':
            return tuple_(dec(e, key) for e in x)
        if tag == 's':
            items = [dec(e, True) for e in x]
            return frozenset_(items) if key else set_(items)
        if tag == 'd':
            return {dec(k, True): dec(v) for k, v in x}
        raise ValueError('unknown tag %r' % tag)

    def lit(path, args, kwargs):
        # A call as the driver reads it: ([name] or [class, method], (args), {kwargs}), the
        # arguments checked plain first (enc refuses the rest); repr of plain values is a literal.
        enc(args), enc(kwargs)
        return repr_((path, tuple_(args), kwargs))

    return enc, dec, lit
