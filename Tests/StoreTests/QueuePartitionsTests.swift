import PostgresStore
import Testing

@Suite("QueuePartitions: queues to partitions, partitions to instances")
struct QueuePartitionsTests {
    @Test func aQueuesPartitionIsFixedAndNamesSpreadEvenly() {
        // Pinned: the partition decides where a queue's data lives, so it may never change.
        #expect(QueuePartitions.of(queue: "downloads") == QueuePartitions.of(queue: "downloads"))
        #expect([QueuePartitions.of(queue: "a"), QueuePartitions.of(queue: "q0"), QueuePartitions.of(queue: "emails")] == [56, 38, 7])
        var counts = [Int](repeating: 0, count: QueuePartitions.count)
        for i in 0..<12_800 { counts[QueuePartitions.of(queue: "queue-\(i)")] += 1 }
        #expect(counts.min() ?? 0 > 140 && counts.max() ?? 0 < 260, "\(counts)")
        #expect(QueuePartitions.partition(ofScope: "p63") == 63)
        for bad in ["p64", "p-1", "p01", "*", "p", "q1", "p1 "] { #expect(QueuePartitions.partition(ofScope: bad) == nil, "\(bad)") }
    }

    @Test func partitionsMoveOnlyToAnInstanceThatComesAndOnlyFromOneThatGoes() {
        let three = ["i-a", "i-b", "i-c"]
        let before = (0..<QueuePartitions.count).map { QueuePartitions.target(of: $0, among: three) }
        for id in three {
            let n = QueuePartitions.targets(of: id, among: three).count
            #expect(n >= 12 && n <= 32, "\(id) gets \(n) of 64")
        }
        let four = (0..<QueuePartitions.count).map { QueuePartitions.target(of: $0, among: three + ["i-d"]) }
        for p in 0..<QueuePartitions.count where four[p] != before[p] { #expect(four[p] == "i-d") }
        #expect(four.filter { $0 == "i-d" }.count >= 8)
        let two = (0..<QueuePartitions.count).map { QueuePartitions.target(of: $0, among: ["i-a", "i-c"]) }
        for p in 0..<QueuePartitions.count where two[p] != before[p] { #expect(before[p] == "i-b") }
        // The order of the list does not matter; an empty one has no target.
        #expect((0..<QueuePartitions.count).map { QueuePartitions.target(of: $0, among: three.reversed()) } == before)
        #expect(QueuePartitions.target(of: 0, among: []) == nil)
    }
}
