import Foundation
import Locking
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
    // MARK: - failover

    @Test(
        "kill -9 of a queue's owner under load: another instance owns it within lease + a few seconds, nothing acknowledged is lost, the feed has no gap and no duplicate"
    )
    func failover() async throws {
        try await TestCluster(name: "failover").run(Self.failover)
    }

    static func failover(_ cluster: TestCluster) throws {
        guard let owner = try cluster.spreadQueue("f") else { return }
        let others = cluster.nodes.filter { $0 !== owner }
        let load = SteadyLoad(clients: 4, queue: "f", prefix: "f", seconds: 0.01...0.1) { others }
        usleep(1_500_000)
        let ackedBefore = load.ledger.acks.count
        let killedAt = monotonicSeconds()
        owner.killNow()

        // The new owner: one of the others says so and the other agrees.
        let newOwner = cluster.awaitHolder(of: "f", among: others, timeout: TestCluster.lease + 15)
        let ownedAfter = monotonicSeconds() - killedAt
        // Serving: the first create sent after the kill and answered 201.
        var servedAfter: Double?
        _ = waitUntil(timeout: 15, every: 0.01) {
            servedAfter = load.ledger.acks.filter { $0.sentAt > killedAt }.map(\.answeredAt).min().map { $0 - killedAt }
            return servedAfter != nil
        }
        usleep(2_000_000)
        let stopped = load.finish()
        let ledger = load.ledger
        var problems = ledger.problems
        if !stopped { problems.append("the clients did not stop within 40 s") }
        guard let newOwner else {
            cluster.record(problems + ["no instance took over within \(TestCluster.lease + 15) s of the kill: \(ledger.summary)"], "takeover")
            return
        }
        if ownedAfter > TestCluster.lease + 5 {
            problems.append(String(format: "the new owner reported only %.2f s after the kill (lease %.0f s)", ownedAfter, TestCluster.lease))
        }
        if servedAfter == nil { problems.append("no create sent after the kill was answered 201 within 15 s of the new owner") }
        if ackedBefore == 0 { problems.append("no create was acknowledged before the kill") }
        let inDoubt = ledger.state.withLock { $0.inDoubt }
        if !inDoubt.isEmpty { problems.append("\(inDoubt.count) creates never answered 201 within 30 s of retries: \(inDoubt.prefix(5))") }
        cluster.record(problems, "failover")

        if !cluster.awaitIdle("f", through: others, timeout: 40) { cluster.record(["queue f still had unfinished operations 40 s after the load"], "waiting") }
        let epochs = cluster.epochRanges(queue: "f")
        cluster.record(epochs.problems, "queue f's events rows per epoch of its partition")
        let listed = Listing(queue: "f", through: newOwner)
        cluster.record(acknowledgedProblems(ledger, listed: listed, through: others[0]), "acknowledged creates")
        cluster.record(cluster.describe(duplicates: listed), "operations created twice under one Idempotency-Key (which epoch wrote each)")
        let (feeds, feedProblems) = Feed.readAll(from: others)
        cluster.record(feedProblems, "the feeds after the failover")
        guard let feed = feeds.first?.feed else { return }
        cluster.record(feed.exactlyOnceProblems(expected: ledger.ackedIDs, inDoubt: listed.ids(named: inDoubt)), "exactly once after the failover")
        print(
            "ClusterTests.failover: queue f's owner opqd #\(owner.index) (pid \(owner.pid)) killed (SIGKILL) after \(ackedBefore) acknowledged creates; "
                + String(
                    format:
                        "every instance named opqd #%d as its holder %.2f s after the kill, the first create sent after it was answered 201 %.2f s after it ",
                    newOwner.index, ownedAfter, servedAfter ?? -1)
                + "(lease \(Int(TestCluster.lease)) s); \(ledger.summary); feed: \(feed.events.count) events; \(epochs.summary)")
    }

    // MARK: - fencing

    @Test(
        "a queue's owner stopped (SIGSTOP) for 3x its lease writes nothing after another took its partitions over, and comes back with the same pid to take its share again"
    )
    func fencing() async throws {
        try await TestCluster(name: "fencing").run { cluster in
            try Self.isolation(
                cluster, Isolation(name: "fencing", cut: "SIGSTOP", heal: "SIGCONT", isolate: { $0.signal(SIGSTOP) }, reconnect: { $0.signal(SIGCONT) }))
        }
    }

    /// How an owner is cut off from the others and PostgreSQL, and brought back.
    struct Isolation: Sendable {
        let name: String
        /// What the cut and the healing are called in messages.
        let cut: String
        let heal: String
        let isolate: @Sendable (ClusterNode) throws -> Void
        let reconnect: @Sendable (ClusterNode) throws -> Void
    }

    /// The owner of queue s is isolated for 3x the lease under load through the others, then
    /// brought back: another instance takes its partitions over, the old owner writes no row
    /// after that (fencing), and comes back with the same pid (re-executed: everything it held
    /// dropped) to take its share again; nothing acknowledged is lost or doubled.
    static func isolation(_ cluster: TestCluster, _ how: Isolation) throws {
        guard let owner = try cluster.spreadQueue("s") else { return }
        guard let oldEpoch = cluster.epoch(of: "s") else {
            cluster.record(["cannot read the epoch of queue s's partition from opqd.ownership"], "start")
            return
        }
        let others = cluster.nodes.filter { $0 !== owner }
        let load = SteadyLoad(clients: 4, queue: "s", prefix: "s", seconds: 0.01...0.1) { others }
        usleep(1_500_000)
        let ackedBefore = load.ledger.acks.count
        let pid = owner.pid
        let execsBefore = owner.listeningLines
        let stoppedAt = monotonicSeconds()
        try how.isolate(owner)
        let newOwner = cluster.awaitHolder(of: "s", among: others, timeout: 3 * TestCluster.lease)
        let ownedAfter = monotonicSeconds() - stoppedAt
        let remaining = stoppedAt + 3 * TestCluster.lease - monotonicSeconds()
        if remaining > 0 { usleep(useconds_t(remaining * 1e6)) }
        let newEpoch = cluster.epoch(of: "s")
        let countOld = "SELECT count(*) FROM opqd.events WHERE queue = 's' AND epoch = \(oldEpoch)"
        let oldRowsAtCont = Int((try? TestPostgres.psql(cluster.database, countOld)) ?? "")
        let contAt = monotonicSeconds()
        try how.reconnect(owner)
        // A few seconds later: the same process, re-executed (a new listening line), serving again.
        var followerAfter: Double?
        _ = waitUntil(timeout: 15, every: 0.05) {
            guard owner.isRunning, owner.listeningLines > execsBefore, owner.clusterView() != nil else { return false }
            followerAfter = monotonicSeconds() - contAt
            return true
        }
        let settle = contAt + 3 - monotonicSeconds()
        if settle > 0 { usleep(useconds_t(settle * 1e6)) }
        let stopped = load.finish()
        let ledger = load.ledger

        var problems = ledger.problems
        if !stopped { problems.append("the clients did not stop within 40 s") }
        if newOwner == nil { problems.append("no other instance took over within \(3 * TestCluster.lease) s of the \(how.cut)") }
        if !owner.isRunning || kill(pid, 0) != 0 {
            problems.append("the stopped owner (pid \(pid)) is gone: \(owner.waitForExit(timeout: 0)?.description ?? "?")")
        }
        if followerAfter == nil {
            problems.append(
                "the old owner (pid \(pid)) was not re-executed and serving again within 15 s of the \(how.heal): \(owner.listeningLines) listening lines, \(owner.clusterView()?.answer ?? [:])"
            )
        }
        // Healed: the three share the partitions again, and agree on who holds queue s's.
        let finalOwner = cluster.awaitSpread(timeout: 15) ? cluster.awaitHolder(of: "s", timeout: 5) : nil
        if finalOwner == nil { problems.append("after the \(how.heal) the three instances do not agree on a spread of the partitions") }
        guard let newEpoch, newEpoch > oldEpoch else {
            cluster.record(problems + ["the epoch went from \(oldEpoch) to \(newEpoch.map(String.init) ?? "nothing") across the takeover"], how.name)
            return
        }
        // The rows: nothing of the old epoch after the new epoch's first event, and nothing at all after the healing.
        let firstNew = try TestPostgres.psql(
            cluster.database, "SELECT coalesce(min(seq), -1) FROM opqd.events WHERE queue = 's' AND epoch = \(newEpoch)")
        let late = try TestPostgres.psql(
            cluster.database,
            "SELECT count(*) FROM opqd.events WHERE queue = 's' AND epoch = \(oldEpoch) AND seq > (SELECT min(seq) FROM opqd.events WHERE queue = 's' AND epoch = \(newEpoch))"
        )
        let oldRowsNow = Int(try TestPostgres.psql(cluster.database, countOld))
        let newRows = try TestPostgres.psql(cluster.database, "SELECT count(*) FROM opqd.events WHERE queue = 's' AND epoch = \(newEpoch)")
        if firstNew == "-1" { problems.append("the new epoch \(newEpoch) wrote no event") }
        if late != "0" { problems.append("\(late) events of the old epoch \(oldEpoch) have a seq above \(firstNew), the new epoch's first") }
        if oldRowsNow != oldRowsAtCont {
            problems.append(
                "events of the old epoch \(oldEpoch): \(oldRowsAtCont.map(String.init) ?? "?") at the \(how.heal), \(oldRowsNow.map(String.init) ?? "?") after")
        }
        let epochs = cluster.epochRanges(queue: "s")
        problems += epochs.problems
        cluster.record(problems, how.name)

        if !cluster.awaitIdle("s", through: others, timeout: 40) { cluster.record(["queue s still had unfinished operations 40 s after the load"], "waiting") }
        let listed = Listing(queue: "s", through: others[0])
        cluster.record(acknowledgedProblems(ledger, listed: listed, through: others[1]), "acknowledged creates")
        cluster.record(cluster.describe(duplicates: listed), "operations created twice under one Idempotency-Key (which epoch wrote each)")
        let (feeds, feedProblems) = Feed.readAll(from: cluster.nodes)
        cluster.record(feedProblems, "the feeds after the partition")
        guard let feed = feeds.first?.feed else { return }
        let inDoubt = ledger.state.withLock { $0.inDoubt }
        cluster.record(feed.exactlyOnceProblems(expected: ledger.ackedIDs, inDoubt: listed.ids(named: inDoubt)), "exactly once after the partition")
        print(
            "ClusterTests.\(how.name): owner opqd #\(owner.index) (pid \(pid), epoch \(oldEpoch)) cut off (\(how.cut)) for \(Int(3 * TestCluster.lease)) s after \(ackedBefore) creates; "
                + String(
                    format: "opqd #%d owned (epoch %d) %.2f s after the cut, opqd #%d at the end; ", newOwner?.index ?? -1, newEpoch, ownedAfter,
                    finalOwner?.index ?? -1)
                + "after the \(how.heal) " + String(format: "the old owner was serving again (re-executed) in %.2f s (", followerAfter ?? -1)
                + "listening lines \(execsBefore) -> \(owner.listeningLines)); events rows: old epoch \(oldRowsNow.map(String.init) ?? "?"), new epoch \(newRows) from seq \(firstNew), \(late) late; "
                + "\(ledger.summary); feed: \(feed.events.count) events; \(epochs.summary)")
    }
}
