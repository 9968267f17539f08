import QueueEngine

/// API.md "Crashes": how unclean stops are counted, per operation, in `meta` (`crashes:<id>`).
/// One rule for a single instance at start (`countUncleanStops`) and for a partition's new
/// holder in a cluster (`PartitionOwner`): an operation that was executing when its instance
/// stopped uncleanly counts one more; one that was not starts over; the third in a row fails it
/// (`crashed-server`) instead of letting it stop the next instance too.
package enum CrashCounts {
    /// Unclean stops in a row that fail an operation.
    package static let poisonAt = 3

    /// The `meta` writes for `operations`, given the stored `counts` and which operations'
    /// runs a crash cut (`crashed`, asked of executing ones only), and the operations that
    /// reached `poisonAt`. `clearOthers`: also delete the counts of operations not among
    /// `operations` (a single instance sees every operation; a partition's holder only its own).
    package static func next(
        operations: [OperationSnapshot], counts: [String: Int], clearOthers: Bool, crashed: (OperationSnapshot) -> Bool
    ) -> (writes: [(key: String, value: String?)], poisoned: Set<OperationID>) {
        var writes: [(key: String, value: String?)] = []
        var poisoned: Set<OperationID> = []
        var counted: Set<String> = []
        var examined: Set<String> = []
        for op in operations {
            let key = key(op.id)
            examined.insert(key)
            guard op.state == .executing, crashed(op) else { continue }
            // A damaged count (negative, or Int.max) must neither trap nor stay stuck.
            let n = max(0, min(counts[key] ?? 0, 999)) + 1
            writes.append((key, String(n)))
            counted.insert(key)
            if n >= poisonAt { poisoned.insert(op.id) }
        }
        // "In a row": an operation whose run was not cut this time starts over.
        for key in counts.keys.sorted() where !counted.contains(key) && (clearOthers || examined.contains(key)) {
            writes.append((key, nil))
        }
        return (writes, poisoned)
    }

    /// The `meta` key of an operation's count.
    package static func key(_ id: OperationID) -> String { "crashes:\(id)" }
}
