import PostgresStore
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// The decisions of one lease period (`PartitionPlanner`), over tables of what was read: no
/// PostgreSQL, no processes, no clock.
@Suite("PartitionPlanner: which partitions to give up and to claim")
struct PartitionPlannerTests {
    static let all = Set(0..<QueuePartitions.count)

    static func targets(_ id: String, _ live: [String]) -> Set<Int> { QueuePartitions.targets(of: id, among: live) }

    @Test("alone, an instance claims every partition nobody leases, in order, and is the only one live")
    func alone() {
        let plan = PartitionPlanner.plan(selfID: "a", live: ["a"], held: [], leased: [], leaving: [])
        #expect(plan.want == Array(0..<QueuePartitions.count))
        #expect(plan.give.isEmpty && PartitionPlanner.live(selfID: "a", read: ["a"]) == ["a"])
    }

    @Test("a joiner is settled (ready) only once it holds its whole share, whatever else it holds")
    func settledOnlyWithItsShare() {
        let live = ["a", "b", "c"]
        let share = Self.targets("c", live)
        #expect(!share.isEmpty)
        #expect(!PartitionPlanner.settled(selfID: "c", live: live, held: []), "nothing held yet")
        #expect(!PartitionPlanner.settled(selfID: "c", live: live, held: Set(share.dropFirst())), "one of its share still elsewhere")
        #expect(PartitionPlanner.settled(selfID: "c", live: live, held: share))
        // Its own heartbeat not read back yet: it counts itself, so its share is the same.
        #expect(PartitionPlanner.settled(selfID: "c", live: ["a", "b"], held: share))
        #expect(PartitionPlanner.settled(selfID: "a", live: ["a"], held: Self.all), "alone: every partition is its share")
        #expect(!PartitionPlanner.settled(selfID: "a", live: ["a"], held: Self.all.subtracting([7])))
    }

    @Test("a departing instance gives up everything it holds except what is already leaving, and claims nothing")
    func departingGivesAll() {
        let plan = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: [1, 2, 3], leased: [1, 2, 3], leaving: [3], departing: true)
        #expect(plan.give == [1, 2] && plan.want.isEmpty)
        let alone = PartitionPlanner.plan(selfID: "a", live: ["a"], held: [], leased: [], leaving: [], departing: true)
        #expect(alone.want.isEmpty, "a departing instance claims nothing, even alone")
    }

    @Test("an instance whose own heartbeat was not read back still counts itself live")
    func selfIsLive() {
        let plan = PartitionPlanner.plan(selfID: "a", live: ["b"], held: [], leased: [], leaving: [])
        #expect(PartitionPlanner.live(selfID: "a", read: ["b"]) == ["b", "a"])
        #expect(Set(plan.want) == Self.targets("a", ["a", "b"]))
    }

    @Test(
        "each instance wants exactly its rendezvous share, and the shares cover every partition once",
        arguments: [["a", "b"], ["a", "b", "c"], ["i-1", "i-2", "i-3", "i-4", "i-5"]])
    func sharesPartition(live: [String]) {
        var covered: [Int] = []
        for id in live {
            let plan = PartitionPlanner.plan(selfID: id, live: live, held: [], leased: [], leaving: [])
            #expect(Set(plan.want) == Self.targets(id, live))
            #expect(plan.want == plan.want.sorted())
            covered += plan.want
        }
        #expect(covered.count == QueuePartitions.count && Set(covered) == Self.all)
    }

    @Test("when a second instance joins, the first gives it exactly the partitions it now wins, and claims none")
    func joinMovesOnlyTheNewcomersShare() {
        let plan = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: Self.all, leased: Self.all, leaving: [])
        #expect(plan.give == Self.targets("b", ["a", "b"]))
        #expect(plan.want.isEmpty)
        // The newcomer wants its share only once the leases on it are gone.
        let early = PartitionPlanner.plan(selfID: "b", live: ["a", "b"], held: [], leased: Self.all, leaving: [])
        #expect(early.want.isEmpty)
        let released = Self.all.subtracting(plan.give)
        let later = PartitionPlanner.plan(selfID: "b", live: ["a", "b"], held: [], leased: released, leaving: [])
        #expect(Set(later.want) == plan.give)
    }

    @Test("when an instance is no longer live, the survivors claim its partitions once its leases are gone")
    func survivorsTakeOver() {
        let three = ["a", "b", "c"]
        let held = Self.targets("a", three)
        let leasedByOthers = Self.targets("b", three).union(Self.targets("c", three))
        // c stopped beating, but its leases are still live: nobody claims them yet.
        let waiting = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: held, leased: held.union(leasedByOthers), leaving: [])
        #expect(Set(waiting.want).isDisjoint(with: Self.targets("c", three)))
        #expect(waiting.give.isEmpty, "a keeps what it held: rendezvous hashing moves only c's share")
        // Its leases ran out: a claims its part of c's share.
        let after = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: held, leased: held.union(Self.targets("b", three)), leaving: [])
        #expect(Set(after.want) == Self.targets("a", ["a", "b"]).subtracting(held))
        #expect(Set(after.want).isSubset(of: Self.targets("c", three)))
    }

    @Test("partitions being given up are neither given again nor claimed back until the release is done")
    func leavingIsLeftAlone() {
        let give = Self.targets("b", ["a", "b"])
        let during = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: Self.all, leased: Self.all, leaving: give)
        #expect(during.give.isEmpty)
        // b has gone again meanwhile: a would want them back, but not while they are leaving.
        let alone = PartitionPlanner.plan(selfID: "a", live: ["a"], held: Self.all.subtracting(give), leased: Self.all.subtracting(give), leaving: give)
        #expect(Set(alone.want).isDisjoint(with: give))
        let done = PartitionPlanner.plan(selfID: "a", live: ["a"], held: Self.all.subtracting(give), leased: Self.all.subtracting(give), leaving: [])
        #expect(Set(done.want) == give)
    }

    @Test("a partition another instance holds a live lease on is never claimed, whoever should hold it")
    func liveLeasesAreRespected() {
        let mine = Self.targets("a", ["a", "b"])
        let plan = PartitionPlanner.plan(selfID: "a", live: ["a", "b"], held: [], leased: mine, leaving: [])
        #expect(plan.want.isEmpty)
    }
}
