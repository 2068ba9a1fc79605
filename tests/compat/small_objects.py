# Many small Python objects (slotted instances and their strings) and a dict over a third of them.
# Prints a digest. Usage: python3 small_objects.py [objects, default 1000000]
import sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000
class P:
    __slots__ = ("a", "b", "name")
    def __init__(self, a, b, name):
        self.a, self.b, self.name = a, b, name
objs = [P(i, i * 7 % 1000, "item-%d-%s" % (i, "y" * (i % 40))) for i in range(n)]
d = {o.name: o for o in objs[::3]}
h = 0
for o in objs:
    h = (h * 1000003 + o.a + o.b + len(o.name)) % 2**61
print("count", len(objs), "dict", len(d), "hash", h)
