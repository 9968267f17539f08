/// How a cluster spreads queues over its instances (CLUSTER.md "Queues are owned, like
/// partitions"): every queue belongs to one of `count` partitions by a hash of its name, fixed
/// forever (a new queue's owner is known before it exists), and each partition is owned by one
/// live instance at a time through its lease row in `opqd.ownership` (scope `p<n>`), with an
/// epoch that fences every commit touching it. Which instance *should* own a partition is
/// rendezvous hashing over the live instances: every instance computes the same answer from
/// the same list, and when one comes or goes only the partitions it wins or held move.
public enum QueuePartitions {
    /// Enough that 3–10 instances share them evenly (a renewal is one statement for all of
    /// an instance's partitions), few enough that a lease row per partition costs nothing.
    public static let count = 64

    /// The partition of a queue: FNV-1a over its name's UTF-8 bytes, finalized (so names that
    /// differ in one character spread), modulo `count`. Never changes: it decides where a
    /// queue's data lives.
    public static func of(queue name: String) -> Int {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in name.utf8 {
            h ^= UInt64(b)
            h = h &* 0x0000_0100_0000_01b3
        }
        return Int(mix(h) % UInt64(count))
    }

    /// The lease row's scope for partition `p`.
    public static func scope(_ p: Int) -> String { "p\(p)" }

    /// The partition a scope names, nil for any other scope (`*` of one-owner clusters).
    public static func partition(ofScope scope: String) -> Int? {
        guard scope.first == "p", let n = Int(scope.dropFirst()), (0..<count).contains(n), scope == "p\(n)" else { return nil }
        return n
    }

    /// The instance that should own partition `p` among `instances` (ids): the one with the
    /// highest weight for it. Nil when there is none.
    public static func target(of p: Int, among instances: [String]) -> String? {
        var best: (weight: UInt64, id: String)?
        for id in instances {
            let w = weight(id, p)
            if let b = best, b.weight > w || (b.weight == w && b.id <= id) { continue }
            best = (w, id)
        }
        return best?.id
    }

    /// Every partition `instance` should own among `instances`.
    public static func targets(of instance: String, among instances: [String]) -> Set<Int> {
        Set((0..<count).filter { target(of: $0, among: instances) == instance })
    }

    static func weight(_ id: String, _ p: Int) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in id.utf8 {
            h ^= UInt64(b)
            h = h &* 0x0000_0100_0000_01b3
        }
        return mix(h ^ mix(UInt64(p) &+ 0x9e37_79b9_7f4a_7c15))
    }

    /// SplitMix64's finalizer: every input bit moves every output bit.
    static func mix(_ x: UInt64) -> UInt64 {
        var z = x
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}
