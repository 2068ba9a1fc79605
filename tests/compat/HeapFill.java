// Fills most of a 1 GiB Java heap with live objects (arrays below G1's humongous size, so they
// live in ordinary regions), then reads them all back; prints a checksum of their contents.
// Usage: java -Xmx1g HeapFill MIB
public class HeapFill {
    public static void main(String[] args) {
        int mib = Integer.parseInt(args[0]);
        int size = 128 << 10;
        int n = mib * 8;
        long[][] blocks = new long[n][];
        for (int i = 0; i < n; i++) {
            long[] b = new long[size / 8];
            for (int j = 0; j < b.length; j++) {
                b[j] = (long) i * 1_000_003L + j;
            }
            blocks[i] = b;
        }
        long h = 0xcbf29ce484222325L;
        for (int i = 0; i < n; i++) {
            for (long v : blocks[i]) {
                h = (h ^ v) * 0x100000001b3L;
            }
        }
        System.out.println("blocks=" + n + " checksum=" + Long.toHexString(h));
    }
}
