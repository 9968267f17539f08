import Dispatch
import Locking
import QueueEngine
import StoreKit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What fences an owner's commits: its instance id and the ownership epoch it won; or, with
/// `partitions`, the epoch of each partition it holds (a commit is fenced by those of the
/// partitions it writes to).
public struct PGFence: Sendable, Equatable {
    public let instance: String
    public let epoch: Int64
    /// The lease: how long a transaction may sit open before the server ends its session.
    public let leaseSeconds: Double
    public let partitions: PartitionEpochs?
    public init(instance: String, epoch: Int64, leaseSeconds: Double = 10, partitions: PartitionEpochs? = nil) {
        self.instance = instance
        self.epoch = epoch
        self.leaseSeconds = leaseSeconds
        self.partitions = partitions
    }
}

/// The partitions an instance holds, with the epoch it won each at (`QueuePartitions`): read
/// by its writer at every commit, changed by its membership as it claims and releases them.
public final class PartitionEpochs: Sendable, Equatable {
    private let held = Lock<[Int: Int64]>([:])
    public init() {}
    public var all: [Int: Int64] { held.withLock { $0 } }
    public func epoch(of partition: Int) -> Int64? { held.withLock { $0[partition] } }
    public func set(_ partition: Int, _ epoch: Int64?) { held.withLock { $0[partition] = epoch } }
    public func remove(_ partitions: some Sequence<Int>) { held.withLock { h in for p in partitions { h[p] = nil } } }
    /// Removes each partition only while it is still held at the epoch given (not one won again since).
    public func remove(_ epochs: [Int: Int64]) {
        held.withLock { h in for (p, e) in epochs where h[p] == e { h[p] = nil } }
    }
    public static func == (a: PartitionEpochs, b: PartitionEpochs) -> Bool { a === b }
}

/// One instance as the `instance` table shows it.
public struct PGInstance: Sendable, Equatable {
    public var id: String
    public var url: String
    /// Microseconds since the Unix epoch, by the database's clock.
    public var startedAt: Int64
    public var heartbeatAt: Int64
    public var isOwner: Bool
}

/// The cluster as one read of the database shows it: live instances and the current owner.
public struct PGClusterView: Sendable {
    public var instances: [PGInstance]
    /// The lease holder while its lease runs.
    public var owner: (id: String, url: String, epoch: Int64)?
}

/// This instance's membership of the cluster (CLUSTER.md), on its own connection:
/// its row in `instance` (heartbeat), and the ownership leases it holds (one per partition,
/// scope `p<n>`, or scope `*` with `--ownership one`), which it renews while it holds them, or
/// takes when the holder's lease ran out.
///
/// Times that decide ownership are the database's (`now()`), never this machine's, so clock
/// skew between instances does not matter. Locally the owner keeps a deadline on the monotonic
/// clock (`ownsUntil`): its authority cannot outlive the moment it *sent* its last successful
/// renewal plus the lease, whatever the database's clock says, so work it starts before that
/// deadline is safe even without a commit (and every commit is fenced anyway).
///
/// @unchecked Sendable: every connection is used under its lock (`session`, `feed`).
public final class PGMembership: @unchecked Sendable {
    public let instanceID: String
    public let leaseSeconds: Double
    private let url: String
    let displayURL: String
    private let session: Lock<PGReader>
    private let feed = Lock<PGReader?>(nil)
    private let deadline = Lock<Int>(0)

    /// Connects and brings the schema up to date (as `PostgresStore` does).
    public init(url: String, instanceID: String, leaseSeconds: Double) throws(PostgresStoreError) {
        self.url = url
        displayURL = PostgresStore.redact(url)
        self.instanceID = instanceID
        self.leaseSeconds = leaseSeconds
        let conn: PGConnection
        do { conn = try PGConnection(url: url) } catch {
            throw PostgresStoreError(.cannotConnect, url: displayURL, detail: error.description)
        }
        try PostgresStore.migrate(conn, url: displayURL)
        session = Lock(PGReader(url: url, connection: conn))
    }

    /// Runs `body` on the connection (a `PGReader`'s, reconnecting once when it was lost).
    /// Lock waits end after the lease: a renewal or takeover never hangs behind a transaction
    /// a cut-off owner left open (the server ends that one after the lease too).
    func withConnection<T>(_ body: (PGConnection) throws(PGFailure) -> T) throws(PGFailure) -> T {
        let ms = String(Int(max(1, min(leaseSeconds, 300)) * 1000))
        return try session.withLock { r throws(PGFailure) in
            try r.withConnection { c throws(PGFailure) in
                try c.exec("SELECT set_config('lock_timeout', $1, false)", [PGParameter(ms)])
                return try body(c)
            }
        }
    }

    /// Inserts or refreshes this instance's row, and tells the others (`movesChannel`): a
    /// partition holder rebalances at once instead of at its next period.
    /// Remembers the database's time of it (`registeredAt`): leases in this id's name not
    /// renewed since were left by a previous process (`claim`).
    public func register(advertise: String) throws {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                WITH i AS (INSERT INTO opqd.instance (id, url, started_at, heartbeat_at) VALUES ($1, $2, now(), now()) \
                ON CONFLICT (id) DO UPDATE SET url = excluded.url, heartbeat_at = excluded.heartbeat_at RETURNING id) \
                SELECT now()::text, pg_notify('\(Self.movesChannel)', $1) FROM i
                """, [PGParameter(instanceID), PGParameter(advertise)])
        }
        if let at = r.text(0, 0) { registered.withLock { $0 = at } }
    }

    /// When this process registered, by the database's clock (text of a timestamptz); nil
    /// before.
    let registered = Lock<String?>(nil)

    /// Leaves the hashing (a clean stop begins): its heartbeat is set far back, so the others
    /// leave it out at once (told on `movesChannel`) and take over what it gives up, while its
    /// row still tells them its URL for the requests they relay to it meanwhile.
    public func depart() throws {
        _ = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                WITH d AS (UPDATE opqd.instance SET heartbeat_at = '-infinity' WHERE id = $1 RETURNING id) \
                SELECT pg_notify('\(Self.movesChannel)', $1) FROM d
                """, [PGParameter(instanceID)])
        }
    }

    /// Every instance's advertised URL, live or not (a departing one still holds leases).
    public func urls() throws -> [String: String] {
        let r = try withConnection { c throws(PGFailure) in try c.exec("SELECT id, url FROM opqd.instance") }
        var out: [String: String] = [:]
        for i in 0..<r.rows {
            if let id = r.text(i, 0), let url = r.text(i, 1) { out[id] = url }
        }
        return out
    }

    /// The channel on which instances say that partitions or instances changed (a claim, a
    /// release, a join, a departure), valued with the sender's id: partition holders listen and
    /// look at once (`listenForMoves`), so a handover takes a round trip, not a lease period.
    public static let movesChannel = "opqd_partitions"

    /// Calls `wake` (on the listener's thread) when another instance says that partitions or
    /// instances changed, and after every (re)connection.
    public func listenForMoves(_ wake: @escaping @Sendable () -> Void) -> PGListener {
        let listener = PGListener(url: url, channel: Self.movesChannel, ignoring: instanceID, wake: wake)
        listener.start()
        return listener
    }

    /// Heartbeat, and forgetting instances silent for long (at least a minute, 10 leases).
    public func beat() throws {
        let forget = max(60, leaseSeconds * 10)
        try withConnection { c throws(PGFailure) in
            try c.exec("UPDATE opqd.instance SET heartbeat_at = now() WHERE id = $1", [PGParameter(instanceID)])
            try c.exec("DELETE FROM opqd.instance WHERE heartbeat_at < now() - make_interval(secs => $1::float8)", [PGParameter(String(forget))])
        }
    }

    /// Takes the ownership when nobody holds it or its holder's lease ran out: the epoch won
    /// and a random token that only the winner knows (the next image of this process proves
    /// with it that it is the winner: `confirm`), or nil when another instance holds it.
    public func tryAcquire() throws -> (epoch: Int64, token: String)? {
        let sent = Self.monotonicNanos()
        var g = SystemRandomNumberGenerator()
        let token = hex64(g.next()) + hex64(g.next())
        // Never beside live partition leases (a partitioned cluster on the same database).
        let r = try withConnection { c throws(PGFailure) in
            try Self.ownershipStep(c) { c throws(PGFailure) in
                try c.exec(
                    """
                    INSERT INTO opqd.ownership AS o (scope, instance, epoch, expires_at, token) \
                    SELECT '*', $1, 1, now() + make_interval(secs => $2::float8), $3 \
                    WHERE NOT EXISTS (SELECT 1 FROM opqd.ownership WHERE scope LIKE 'p%' AND expires_at > now()) \
                    ON CONFLICT (scope) DO UPDATE SET instance = excluded.instance, epoch = o.epoch + 1, expires_at = excluded.expires_at, \
                    token = excluded.token WHERE o.expires_at < now() RETURNING epoch
                    """, [PGParameter(instanceID), PGParameter(String(leaseSeconds)), PGParameter(token)])
            }
        }
        guard r.rows == 1, let epoch = r.int64(0, 0) else { return nil }
        extendDeadline(from: sent)
        return (epoch, token)
    }

    /// The next image of the process that won `epoch` confirms it with the winner's `token`
    /// (from its environment), and renews the lease: true when both still match.
    public func confirm(epoch: Int64, token: String) throws -> Bool {
        let sent = Self.monotonicNanos()
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                UPDATE opqd.ownership SET expires_at = now() + make_interval(secs => $4::float8) \
                WHERE scope = '*' AND instance = $1 AND epoch = $2::bigint AND token = $3
                """, [PGParameter(instanceID), PGParameter(epoch), PGParameter(token), PGParameter(String(leaseSeconds))])
        }
        guard r.changes == 1 else { return false }
        extendDeadline(from: sent)
        return true
    }

    /// Renews the lease at `epoch` (also one that ran out: while the epoch is unchanged nobody
    /// took over): true when it is still ours.
    public func renew(epoch: Int64) throws -> Bool {
        let sent = Self.monotonicNanos()
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                UPDATE opqd.ownership SET expires_at = now() + make_interval(secs => $3::float8) \
                WHERE scope = '*' AND instance = $1 AND epoch = $2::bigint
                """, [PGParameter(instanceID), PGParameter(epoch), PGParameter(String(leaseSeconds))])
        }
        guard r.changes == 1 else { return false }
        extendDeadline(from: sent)
        return true
    }

    /// Gives the ownership up at once (a clean stop), so another instance takes over without
    /// waiting for the lease to run out; and removes this instance's row.
    public func release(epoch: Int64?) {
        _ = try? withConnection { c throws(PGFailure) in
            if let epoch {
                try c.exec(
                    "UPDATE opqd.ownership SET expires_at = now() - interval '1 second' WHERE scope = '*' AND instance = $1 AND epoch = $2::bigint",
                    [PGParameter(instanceID), PGParameter(epoch)])
            }
            try c.exec("DELETE FROM opqd.instance WHERE id = $1", [PGParameter(instanceID)])
        }
        deadline.withLock { $0 = 0 }
    }

    /// True until the lease this instance last renewed may have run out (monotonic clock).
    public var ownsNow: Bool { Self.monotonicNanos() < deadline.withLock { $0 } }

    func extendDeadline(from sent: Int) {
        // A little under the lease: the database's clock may run slightly faster than ours.
        let lease = Int(leaseSeconds * 0.95 * 1e9)
        deadline.withLock { $0 = sent &+ lease }
    }

    /// Live instances (a heartbeat within `stale` seconds) and the current owner.
    public func view(stale: Double) throws -> PGClusterView {
        let (rows, owner) = try withConnection { c throws(PGFailure) in
            let rows = try c.exec(
                """
                SELECT id, url, floor(extract(epoch FROM started_at) * 1000000)::bigint, \
                floor(extract(epoch FROM heartbeat_at) * 1000000)::bigint FROM opqd.instance \
                WHERE heartbeat_at > now() - make_interval(secs => $1::float8) ORDER BY started_at, id
                """, [PGParameter(String(stale))])
            let owner = try c.exec(
                """
                SELECT o.instance, coalesce(i.url, ''), o.epoch FROM opqd.ownership o LEFT JOIN opqd.instance i ON i.id = o.instance \
                WHERE o.scope = '*' AND o.expires_at > now()
                """)
            return (rows, owner)
        }
        var view = PGClusterView(instances: [], owner: nil)
        if owner.rows == 1, let id = owner.text(0, 0), let url = owner.text(0, 1), let epoch = owner.int64(0, 2) {
            view.owner = (id, url, epoch)
        }
        for i in 0..<rows.rows {
            guard let id = rows.text(i, 0), let url = rows.text(i, 1), let started = rows.int64(i, 2), let beat = rows.int64(i, 3) else { continue }
            view.instances.append(PGInstance(id: id, url: url, startedAt: started, heartbeatAt: beat, isOwner: view.owner?.id == id))
        }
        return view
    }

    /// Every queue's name, sorted (what the owner runs, as a follower reports it).
    public func queueNames() throws -> [String] {
        let r = try withConnection { c throws(PGFailure) in try c.exec("SELECT name FROM opqd.queues ORDER BY name") }
        return (0..<r.rows).compactMap { r.text($0, 0) }
    }

    /// Committed events after `seq`, oldest first (a follower's feed), on a second connection
    /// with a lock of its own, so the feed and the heartbeat never wait for each other.
    public func events(after seq: UInt64, limit: Int) throws -> [ChangeEvent] {
        try withFeed { r throws(PGFailure) in try r.events(after: seq, limit: limit) }
    }

    /// The newest events, oldest first (where a follower's feed starts).
    public func recentEvents(limit: Int) throws -> [ChangeEvent] {
        try withFeed { r throws(PGFailure) in try r.recentEvents(limit: limit) }
    }

    /// The feed's reader, connected on first use.
    private func withFeed<T>(_ body: (PGReader) throws(PGFailure) -> T) throws(PGFailure) -> T {
        try feed.withLock { r throws(PGFailure) in
            let reader: PGReader
            if let existing = r {
                reader = existing
            } else {
                reader = PGReader(url: url, connection: try PGConnection(url: url))
                r = reader
            }
            return try body(reader)
        }
    }

    /// The newest seq ever given out (`last_seq` in meta, or the newest event).
    public func lastSeq() throws -> UInt64 {
        let r = try withConnection { c throws(PGFailure) in try c.exec(PGSchema.lastSeq) }
        return (try? PGReader.lastSeq(r)) ?? 0
    }

    public func close() {
        session.withLock { $0.close() }
        feed.withLock { r in
            r?.close()
            r = nil
        }
    }

    static func monotonicNanos() -> Int { clockNanos(CLOCK_MONOTONIC) }
}

/// Wakes a reader when a writer committed events: a `NOTIFY opqd_events` sent inside a commit
/// that holds events (so it arrives only once they are visible), at most one per writer every
/// 5 ms (a commit that skips it is announced by the next, or once the 5 ms are up); or, with
/// `channel`, any other channel (`PGMembership.movesChannel`). Received on a connection of its
/// own that `LISTEN`s. `wake` runs on the
/// listener's thread for every batch of notifications, and once after every (re)connection, so
/// nothing committed while it was away is left unread. Reconnects with backoff.
public final class PGListener: @unchecked Sendable {
    public static let channel = "opqd_events"
    private let url: String
    private let listens: String
    private let wake: @Sendable () -> Void
    private let ignoring: String?
    private let stopping = Atomic<Bool>(false)

    /// `ignoring`: an instance id whose own commits do not wake it (its feed has them already).
    public init(url: String, channel: String = PGListener.channel, ignoring: String? = nil, wake: @escaping @Sendable () -> Void) {
        self.url = url
        listens = channel
        self.ignoring = ignoring
        self.wake = wake
    }

    /// Runs on a queue of its own, blocked in `poll` most of the time.
    public func start() {
        DispatchQueue(label: "opqd.listen").async { [self] in run() }
    }

    /// Stops within a second (the thread's poll interval).
    public func stop() { stopping.store(true, ordering: .releasing) }

    private func run() {
        var delay: UInt32 = 50_000
        while !stopping.load(ordering: .acquiring) {
            do throws(PGFailure) {
                let c = try PGConnection(url: url)
                defer { c.close() }
                try c.exec("LISTEN \(listens)")
                delay = 50_000
                wake()
                while !stopping.load(ordering: .acquiring) {
                    if try c.awaitNotifications(seconds: 1, ignoring: ignoring) > 0 { wake() }
                }
            } catch {
                usleep(delay)
                delay = min(delay * 2, 2_000_000)
            }
        }
    }
}

/// 16 lowercase hex digits, zero-padded.
func hex64(_ n: UInt64) -> String {
    let s = String(n, radix: 16)
    return String(repeating: "0", count: max(0, 16 - s.count)) + s
}
