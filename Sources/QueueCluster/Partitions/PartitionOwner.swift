import Dispatch
import Locking
import Logging
import MicroHTTP
import PostgresStore
import QueueAPI
import QueueEngine
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Who owns a partition as this instance last read it (for routing): the instance and the URL
/// it advertises.

/// This instance's share of a partitioned cluster (CLUSTER.md "Queues are owned, like
/// partitions"; `QueuePartitions`). Every period it heartbeats, renews the leases of the
/// partitions it holds, gives up those that rendezvous hashing now gives to another live
/// instance, and claims the free ones hashing gives to it, loading their queues from
/// PostgreSQL into its engine with the restart rules (`QueueEngine.adopt`).
///
/// It is also the engine's directory of operations held elsewhere (`RemoteOperations`): their
/// states are read from PostgreSQL, and their ends come from the feed (`eventsPublished`, every
/// event of every instance in seq order) and, as a safety net, from a look at every waited-for
/// operation each period.
///
/// Giving a partition up: it leaves `serving` first (requests for it are forwarded from then on),
/// waits for the requests decided "served here" just before to reach the engine (`ServingGate`),
/// then the engine (`release`: nothing of it is written any more), and the lease row is given
/// up only once everything written before is durable, so the next owner loads all of it and
/// this instance's commits never touch a partition it no longer holds.
///
/// Losing one (a renewal finds it taken: this instance was stopped or cut off past its lease;
/// or a commit is fenced) calls `lost`, which re-executes the process: what it held in memory
/// is dropped whole, as with the one-owner cluster.
package final class PartitionOwner: RemoteOperations, QueuePlacement, @unchecked Sendable {
    let membership: PGMembership
    let store: PostgresStore
    /// The partitions held with their epochs: what the writer fences each commit by.
    let held: PartitionEpochs
    let token: String
    let logger: Logger
    package let selfID: String
    private let lost: @Sendable (String) -> Void
    private let engineBox = Locking.Lock<QueueEngine?>(nil)
    private let watched = Locking.Lock<Set<UInt64>>([])
    /// Partitions whose requests this instance answers (held, loaded, not being given up).
    private let serving = Locking.Lock<Set<Int>>([])
    /// Requests between their decision "served here" and the engine (`release` waits for them).
    private let gate = ServingGate()
    /// Partitions out of `serving` whose requests inside the gate are waited for: the engine
    /// still takes new queues in them (a `POST /v1/queues` decided "served here" a moment before).
    private let draining = Locking.Lock<Set<Int>>([])
    private let holders = Locking.Lock<[Int: PlacementHolder]>([:])
    private let advertised = Locking.Lock("")
    private let others = Locking.Lock<Bool>(false)
    private let lastError = Locking.Lock<String?>(nil)
    /// The last read of the instances and of every queue's name (for `GET /v1/cluster`).
    private let picture = Locking.Lock<(view: PGClusterView?, queues: [String])>((nil, []))
    /// Ticks, claims and releases run here, one at a time.
    let work = DispatchQueue(label: "opqd.partitions")
    /// The heartbeat and the renewals run here, never behind a claim's load of its queues
    /// (however large) on `work`.
    let renewals = DispatchQueue(label: "opqd.partitions.renewals")
    /// Held while the leases in `held` are renewed, and while one is taken out of `held` and
    /// given up: a renewal never extends a lease given up a moment before.
    private let leaseLock = Locking.Lock(())
    /// Called on `work` before the queues of partitions won are read (tests slow it down).
    private let loading = Locking.Lock<(@Sendable () -> Void)?>(nil)
    private let background = BackgroundServices()
    /// Set once a period found the placement settled (`unready`).
    private let joined = Atomic<Bool>(false)
    private let stopped = Locking.Lock<Bool>(false)
    private let changed = Locking.Lock<(@Sendable (PlacementChange) -> Void)?>(nil)
    /// The parts of committed batches across instances in partitions being taken
    /// (`BatchAcross.pending`): read with their queues, added right after those are loaded,
    /// before any request of theirs is served.
    private let batchParts = Locking.Lock<(@Sendable (Set<Int>) throws -> (@Sendable () -> Void))?>(nil)
    /// Partitions being given up (out of `serving`, not yet out of `held`).
    private let leaving = Locking.Lock<Set<Int>>([])
    /// Set by `handOver`: this instance is leaving the cluster (a clean stop). Its periods give
    /// every partition up and claim none.
    private let departing = Atomic<Bool>(false)
    /// Wakes a period at once when another instance claims, releases, joins or leaves.
    private let moves = Locking.Lock<PGListener?>(nil)
    /// A period asked for by `moves` is queued on `work` and not run yet: more wake-ups meanwhile
    /// are that one.
    private let soon = Atomic<Bool>(false)
    /// Ids waited for that a look at PostgreSQL is due for, and whether one is scheduled: the
    /// looks run on `checks`, one at a time, never on `work` (renewals never wait for them).
    private let due = Locking.Lock<(ids: Set<UInt64>, scheduled: Bool)>(([], false))
    let checks = DispatchQueue(label: "opqd.partitions.checks")
    /// The longest a given-up partition's lease is kept after its runs were told to stop, so
    /// that they are gone (a command's SIGTERM, then SIGKILL after its grace: the kinds'
    /// `stopGrace`) before another instance may start them again.
    let stopGrace: Double

    package init(
        membership: PGMembership, store: PostgresStore, held: PartitionEpochs, token: String, logger: Logger, stopGrace: Double = 3,
        lost: @escaping @Sendable (String) -> Void
    ) {
        self.stopGrace = stopGrace
        self.membership = membership
        self.store = store
        self.held = held
        self.token = token
        self.logger = logger
        self.selfID = membership.instanceID
        self.lost = lost
    }

    var engine: QueueEngine? { engineBox.withLock { $0 } }

    /// `.adopted` after queues were taken in, before they are served (the application reloads
    /// what it keeps of theirs beside the engine: the answers kept for Idempotency-Keys, which
    /// their previous owner committed with the changes); `.released` when partitions are given
    /// up, after the engine let their queues go.
    package func onChange(_ body: @escaping @Sendable (PlacementChange) -> Void) { changed.withLock { $0 = body } }

    /// How often it renews and rebalances: a third of the lease, at most every second.
    var period: Double { min(1, membership.leaseSeconds / 3) }

    /// Starts serving with `engine`: its ids come from a block of this instance, the partitions
    /// hashing gives it that are free are claimed and loaded now, and the period's timer runs.
    package func start(engine: QueueEngine, advertise: String) throws {
        engineBox.withLock { $0 = engine }
        engine.setRemoteOperations(self)
        let (serving, draining) = (self.serving, self.draining)
        engine.onlyQueues { name in
            let p = QueuePartitions.of(queue: name)
            return serving.withLock { $0.contains(p) } || draining.withLock { $0.contains(p) }
        }
        try membership.register(advertise: advertise)
        advertised.withLock { $0 = advertise }
        engine.useIDs(try membership.takeIDBlock())
        renewals.sync { beatAndRenew() }
        work.sync { tick() }
        background.start([
            PeriodicService("partitions", every: period, on: work) { [self] in tick() },
            PeriodicService("renewals", every: period, on: renewals) { [self] in beatAndRenew() },
        ])
        moves.withLock { $0 = membership.listenForMoves { [weak self] in self?.tickSoon() } }
    }

    /// Runs `body` before the queues of partitions won are read, on `work` (tests: a slow load).
    func beforeLoading(_ body: (@Sendable () -> Void)?) { loading.withLock { $0 = body } }

    /// See `batchParts`.
    func onTake(batches: @escaping @Sendable (Set<Int>) throws -> (@Sendable () -> Void)) { batchParts.withLock { $0 = batches } }

    /// A period now (queued on `work`), for a move another instance announced.
    private func tickSoon() {
        guard !soon.exchange(true, ordering: .acquiringAndReleasing) else { return }
        work.async { [self] in
            soon.store(false, ordering: .releasing)
            tick()
        }
    }

    /// A clean stop's first step (SIGTERM), while this instance still answers requests: it leaves
    /// the hashing (its heartbeat is set far back, and the others are told at once; its row
    /// still gives them its URL), gives every partition up in
    /// the usual order (out of `serving`, then out of the engine, then, once durable, the lease,
    /// announced), and waits until another live instance holds each, or `seconds` pass. Requests
    /// for its queues meanwhile wait for their new holder (`ClusterFront`) and are forwarded.
    /// True when others hold them all (the caller may keep relaying a moment, for load
    /// balancers to notice `/readyz`); false alone, or past `seconds`. Bounded: the steps run on
    /// `work` (behind a claim under way) while this waits no longer than `seconds`.
    @discardableResult
    package func handOver(within seconds: Double) -> Bool {
        guard !stopped.withLock({ $0 }), engine != nil, !departing.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        let deadline = DispatchTime.now() + max(0, seconds)
        // Alone, nobody could take the partitions over: they are given up at the stop's end.
        guard othersAlive else {
            departing.store(false, ordering: .releasing)
            return false
        }
        // What it holds now (or is giving up): done once others hold each of these.
        let had = Set(held.all.keys).union(leaving.withLock { $0 })
        let begun = DispatchSemaphore(value: 0)
        work.async { [self] in
            do { try membership.depart() } catch {
                logger.warning("cannot leave the cluster's list of instances (the others see it go after a lease)", metadata: ["error": "\(error)"])
            }
            tick()
            begun.signal()
        }
        logger.info("handing every partition over before stopping", metadata: ["partitions": "\(held.all.count)"])
        if begun.wait(timeout: deadline) == .success {
            while DispatchTime.now() < deadline {
                if held.all.isEmpty {
                    _ = try? readHolders()
                    let map = holderMap
                    // Its partitions held by others, whose URLs are known: they are served again.
                    if had.allSatisfy({ p in map[p].map { $0.instance != selfID && !$0.url.isEmpty } ?? false }) {
                        logger.info("every partition is held by another instance")
                        return true
                    }
                }
                usleep(20_000)
            }
        }
        logger.warning(
            "stopping before every partition was taken over (the rest move when their leases run out)",
            metadata: ["still held": "\(held.all.keys.sorted())"])
        return false
    }

    /// Reads who holds each partition now, with its URL (a departing instance's too: it still
    /// holds leases a moment), into `holders`.
    @discardableResult
    private func readHolders() throws -> [Int: PlacementHolder] {
        let urls = try membership.urls()
        var map: [Int: PlacementHolder] = [:]
        for l in try membership.partitionLeases() where l.live {
            map[l.partition] = PlacementHolder(instance: l.instance, url: urls[l.instance] ?? "")
        }
        holders.withLock { $0 = map }
        return map
    }

    /// Stops the timer and gives every partition up at once (a clean stop), once what was
    /// written is durable.
    package func stop() {
        let first = stopped.withLock { s -> Bool in
            defer { s = true }
            return !s
        }
        guard first else { return }
        background.stopAll()
        moves.withLock { l in
            l?.stop()
            l = nil
        }
        // After a tick under way: it could claim or renew what is given up here.
        work.sync {
            serving.withLock { $0 = [] }
            leaseLock.withLock { _ in
                let epochs = held.all
                try? membership.release(epochs)
                held.remove(epochs)
            }
            membership.release(epoch: nil)
        }
    }

    /// Stops the timer and serving without a word to PostgreSQL (the process is going: a role
    /// change, or a crash as tests play it): the partitions go when their leases run out.
    package func abandon() {
        stopped.withLock { $0 = true }
        background.stopAll()
        moves.withLock { $0?.stop() }
        serving.withLock { $0 = [] }
    }

    // MARK: - routing

    /// True when this instance answers requests for the queue `name` itself.
    package func whileServing<T>(_ body: () throws -> T) rethrows -> T { try gate.pass(body) }

    package func serves(queue name: String) -> Bool {
        let p = QueuePartitions.of(queue: name)
        return serving.withLock { $0.contains(p) }
    }

    /// Where requests for the queue `name` go when this instance does not serve it: its
    /// partition's holder as last read (nil: nobody holds it right now).
    package func holder(ofQueue name: String) -> PlacementHolder? {
        let p = QueuePartitions.of(queue: name)
        return holders.withLock { $0[p] }
    }

    /// The URL this instance advertises to the others (`start`).
    package var selfURL: String { advertised.withLock { $0 } }

    /// Partition -> holder, as last read (this instance included).
    var holderMap: [Int: PlacementHolder] { holders.withLock { $0 } }
    var servingPartitions: Set<Int> { serving.withLock { $0 } }
    var othersAlive: Bool { others.withLock { $0 } }
    var unavailable: String? { lastError.withLock { $0 } }

    /// Kinds start only while this instance may act for its partitions: the lease it last
    /// renewed cannot have run out yet, or nobody else was alive to take them.
    package var mayAct: Bool { !stopped.withLock { $0 } && (membership.ownsNow || !othersAlive) }

    // MARK: - QueuePlacement

    /// Others hold the other partitions, and count their own crashes.
    package var servesEveryQueue: Bool { false }
    /// Commits are fenced by the partitions' epochs; a start waits for its commit.
    package var startsAfterCommit: Bool { true }

    /// Not ready until a period found this instance holding its whole share (nothing more
    /// moves to it) and every other partition held by a live instance whose URL is known: until
    /// then a request for a queue moving to it, or held by nobody yet, would get 503 `no-owner`.
    /// Once ready it stays so (a later move is a handover, not a reason to leave the balancer).
    package var unready: String? {
        if joined.load(ordering: .acquiring) { return nil }
        if let error = unavailable { return "cannot reach PostgreSQL for the cluster's partitions: \(error)" }
        return "joining the cluster: taking this instance's share of the \(QueuePartitions.count) partitions"
    }

    /// False once the leases may have run out: every partition held here is dropped (the
    /// process starts again), and the next holders restart what ran.
    package func mayStart() -> Bool {
        if mayAct { return true }
        lost("the partitions' leases may have run out")
        return false
    }

    package func clusterView(ownQueues: [String]) throws -> ClusterView { try clusterView() }

    // MARK: - the period

    /// Every period, on `renewals`: the heartbeat, and the renewal of every lease held (one
    /// statement). A renewal that finds a partition taken means this instance was cut off past
    /// its lease: it drops everything (`lost`).
    func beatAndRenew() {
        guard !stopped.withLock({ $0 }), engine != nil else { return }
        do {
            // A departing instance has left the hashing: a beat would bring it back.
            if !departing.load(ordering: .acquiring) { try membership.beat() }
            let gone: (gone: [Int], held: [Int: Int64], kept: Set<Int>)? = try leaseLock.withLock { _ in
                let mine = held.all
                guard !mine.isEmpty else { return nil }
                let kept = try membership.renew(mine)
                return kept.count < mine.count ? (Set(mine.keys).subtracting(kept).sorted(), mine, kept) : nil
            }
            if let gone {
                logger.warning(
                    "partitions taken over by another instance (this one was cut off past its lease)",
                    metadata: ["partitions": "\(gone.gone)", "held": "\(gone.held)", "kept": "\(gone.kept.sorted())"])
                lost("partitions \(gone.gone) were taken over by another instance")
            }
        } catch {
            // The period's tick says so (`lastError`); past the lease the partitions are dropped.
            if !held.all.isEmpty && !membership.ownsNow && othersAlive {
                lost("the partitions' leases may have run out while PostgreSQL could not be reached")
            }
        }
    }

    func tick() {
        guard !stopped.withLock({ $0 }), let engine else { return }
        let departing = departing.load(ordering: .acquiring)
        do {
            // Live: a heartbeat within one lease (a beat comes every third of it). An instance
            // that stopped beating loses its place in the hashing as soon as its leases can
            // have run out, so its partitions move within lease + a period; one that was only
            // slow keeps its live leases (nobody claims those) and comes back into the hashing.
            let view = try membership.view(stale: max(1, membership.leaseSeconds))
            let live =
                departing ? view.instances.map(\.id).filter { $0 != selfID } : PartitionPlanner.live(selfID: selfID, read: view.instances.map(\.id))
            others.withLock { $0 = departing ? !live.isEmpty : live.count > 1 }

            let mine = held.all
            let map = try readHolders()
            let names = (try? store.queueNames()) ?? picture.withLock { $0.queues }
            picture.withLock { $0 = (view, names) }
            lastError.withLock { $0 = nil }

            // A lease still in this instance's name that it does not hold was left by its previous
            // process (the same identity): claimed back at once (`PGMembership.claim`).
            let leased = Set(map.filter { $0.value.instance != selfID || mine[$0.key] != nil }.keys)
            let plan = PartitionPlanner.plan(
                selfID: selfID, live: live, held: Set(mine.keys), leased: leased, leaving: leaving.withLock { $0 }, departing: departing)
            if !plan.give.isEmpty { release(plan.give, engine: engine) }
            if !plan.want.isEmpty {
                let (won, abandoned) = try membership.claimNoting(plan.want, token: token, alone: mine.isEmpty)
                if !won.isEmpty { try adopt(won, abandoned: abandoned, engine: engine) }
            }
            if engine.idsLeft < 1 << 20 { engine.useIDs(try membership.takeIDBlock()) }
            reconcile(engine)
            if !joined.load(ordering: .relaxed) {
                let mine = Set(held.all.keys)
                let known = map.filter { $0.value.instance == selfID || !$0.value.url.isEmpty }.keys
                if plan.give.isEmpty && Set(known).union(mine).count == QueuePartitions.count
                    && PartitionPlanner.settled(selfID: selfID, live: live, held: mine)
                {
                    joined.store(true, ordering: .releasing)
                    logger.info("ready: this instance holds its share of the partitions", metadata: ["partitions": "\(mine.count)"])
                }
            }
        } catch {
            let message = "\(error)"
            let first = lastError.withLock { e -> Bool in
                defer { e = message }
                return e == nil
            }
            if first { logger.warning("cannot reach PostgreSQL for the cluster's partitions", metadata: ["error": "\(message)"]) }
            if !held.all.isEmpty && !membership.ownsNow && othersAlive {
                lost("the partitions' leases may have run out while PostgreSQL could not be reached")
            }
        }
    }

    /// Loads the queues of the partitions won and hands them to the engine. They are in `held`
    /// first (restoring writes: recovery moves), and served once loaded. `abandoned`: those
    /// whose holder did not give them up (see `countCrashes`); the queues of the others were
    /// handed over cleanly, and their schedules lose no nominal time to the move
    /// (`RecoveredState.handedOver`).
    private func adopt(_ won: [Int: Int64], abandoned: Set<Int>, engine: QueueEngine) throws {
        for (p, e) in won { held.set(p, e) }
        let names: [String]
        var recovered: RecoveredState
        let remote: RemoteStates
        let block: Range<UInt64>
        let addBatches: (@Sendable () -> Void)?
        loading.value?()
        let began = DispatchTime.now()
        var loaded = began
        do {
            names = try store.queueNames().filter { won[QueuePartitions.of(queue: $0)] != nil }
            (recovered, remote) = try store.load(queues: names)
            loaded = DispatchTime.now()
            addBatches = try batchParts.value?(Set(won.keys))
            block = try membership.takeIDBlock()
            recovered.poisoned = try countCrashes(recovered, abandoned: abandoned)
            recovered.handedOver = Set(names.filter { !abandoned.contains(QueuePartitions.of(queue: $0)) })
        } catch {
            // Nothing was taken in: give the partitions back, to be claimed again (those
            // abandoned by their last holder still marked so).
            leaseLock.withLock { _ in
                held.remove(won)
                try? membership.release(won, abandoned: abandoned)
            }
            throw error
        }
        // Ids above every stored one: this queue's next operations come after its old ones.
        engine.useIDs(block)
        // The block's number is the generation of the queues taken in (queue ETags name it): it
        // is durable, and larger than any an earlier owner used.
        recovered.generation = block.lowerBound >> PGMembership.idBlockBits
        engine.adopt(recovered, remote: remote)
        addBatches?()
        changed.value?(.adopted(partitions: won.keys.sorted()))
        serving.withLock { $0.formUnion(won.keys) }
        holders.withLock { h in for p in won.keys { h[p] = PlacementHolder(instance: selfID, url: "") } }
        // The handover's length at this end: a request for these queues was held meanwhile.
        func seconds(_ from: DispatchTime, _ to: DispatchTime) -> String {
            String(format: "%.3f", Double(to.uptimeNanoseconds &- from.uptimeNanoseconds) / 1e9)
        }
        logger.info(
            "partitions taken",
            metadata: [
                "partitions": "\(won.keys.sorted())", "queues": "\(recovered.queues.count)", "operations": "\(recovered.operations.count)",
                "read seconds": "\(seconds(began, loaded))", "taken in seconds": "\(seconds(loaded, DispatchTime.now()))",
            ])
    }

    /// API.md "Crashes" across instances: an operation that was executing in a partition whose
    /// holder stopped without giving it up counts one unclean stop (`crashes:<id>` in `meta`,
    /// as a single instance counts them); one handed over cleanly, or not executing, starts
    /// over. Durable before anything of the partitions runs. Answers those that reached 3:
    /// their run may be what stops the instances, so they fail instead of moving on to the next.
    private func countCrashes(_ recovered: RecoveredState, abandoned: Set<Int>) throws -> Set<OperationID> {
        var counts: [String: Int] = [:]
        // Read or refused: counts taken as none would start every operation's count over.
        for (key, value) in try store.readMeta(prefix: "crashes:") { counts[key] = Int(value) ?? 0 }
        let (writes, poisoned) = CrashCounts.next(operations: recovered.operations, counts: counts, clearOthers: false) { op in
            abandoned.contains(QueuePartitions.of(queue: op.queue))
        }
        guard !writes.isEmpty else { return [] }
        if !abandoned.isEmpty { logger.warning("partitions taken from an instance that stopped uncleanly", metadata: ["partitions": "\(abandoned.sorted())"]) }
        let committed = DispatchSemaphore(value: 0)
        // Bounded well within a lease: the renewals of the partitions already held wait on the
        // same queue.
        guard store.setMeta(writes, then: { committed.signal() }),
            committed.wait(timeout: .now() + max(membership.leaseSeconds / 3, 0.5)) == .success
        else {
            throw CrashCountNotCommitted()
        }
        return poisoned
    }

    /// Gives partitions up (see the type's comment for the order).
    private func release(_ parts: Set<Int>, engine: QueueEngine) {
        leaving.withLock { $0.formUnion(parts) }
        draining.withLock { $0.formUnion(parts) }
        serving.withLock { $0.subtract(parts) }
        // A request decided "served here" a moment ago reaches the engine before its queue goes
        // (bounded: a handler stuck on an outage does not hold the handover up).
        if !gate.drain(within: 1) {
            logger.warning("giving partitions up with a request still in its handler", metadata: ["partitions": "\(parts.sorted())"])
        }
        draining.withLock { $0.subtract(parts) }
        // Decided inside the engine's lock: a queue created a moment ago in these partitions goes
        // too, and none can be created in them from now on (`onlyQueues`).
        let stopped = engine.release(handingOver: true) { parts.contains(QueuePartitions.of(queue: $0)) }
        changed.value?(.released { parts.contains(QueuePartitions.of(queue: $0)) })
        let epochs = held.all.filter { parts.contains($0.key) }
        engine.whenDurable { [self] in
            // Runs told to stop get the time to be gone before another instance may start them
            // (a command's child: SIGTERM, then SIGKILL after its grace); those of other kinds
            // are gone at once.
            work.asyncAfter(deadline: .now() + min(stopped.grace, stopGrace)) { [self] in
                leaseLock.withLock { _ in
                    held.remove(epochs)
                    do { try membership.release(epochs) } catch {
                        logger.warning("cannot give partitions up (they go when their lease runs out)", metadata: ["error": "\(error)"])
                    }
                }
                leaving.withLock { $0.subtract(parts) }
                logger.info("partitions given up", metadata: ["partitions": "\(parts.sorted())", "stopped runs": "\(stopped.runs)"])
            }
        }
    }

    /// Its `/metrics` families about the cluster.
    package func writeMetrics(to out: inout Exposition) {
        let n = servingPartitions.count
        ClusterDirectory.writeOwnerGauge(n > 0, to: &out)
        out.family(
            "opqd_cluster_partitions", .gauge, "The partitions this instance owns and serves (of opqd_cluster_partitions_total).")
        out.sample("opqd_cluster_partitions", "", n)
        out.family("opqd_cluster_partitions_total", .gauge, "The partitions the queues are spread over.")
        out.sample("opqd_cluster_partitions_total", "", QueuePartitions.count)
    }

    /// `GET /v1/cluster`: the live instances, each with the partitions it holds and their
    /// queues, as last read (every period).
    package func clusterView() throws -> ClusterView {
        let (view, names) = picture.withLock { $0 }
        guard let view else {
            throw ClusterUnavailable(detail: unavailable ?? "the cluster's state has not been read yet")
        }
        let map = holderMap
        var parts: [String: [Int]] = [:]
        for (p, h) in map { parts[h.instance, default: []].append(p) }
        var queues: [String: [String]] = [:]
        for n in names {
            if let h = map[QueuePartitions.of(queue: n)] { queues[h.instance, default: []].append(n) }
        }
        return ClusterView(
            mode: "cluster", store: "postgres", ownership: "partitions", partitions: QueuePartitions.count,
            instances: view.instances.map { i in
                let held = (parts[i.id] ?? []).sorted()
                return ClusterDirectory.instance(i, selfID: selfID, owner: !held.isEmpty, partitions: held, queues: queues[i.id] ?? [])
            })
    }

    // MARK: - RemoteOperations

    package func states(of ids: [OperationID]) throws(EngineError) -> [OperationID: Bool] {
        do { return try store.operationStates(ids).finished } catch {
            throw .unavailable("cannot read operations of other instances from PostgreSQL: \(error)")
        }
    }

    package func operation(_ id: OperationID) throws(EngineError) -> OperationSnapshot? {
        do { return try store.operation(id) } catch {
            throw .unavailable("cannot read operations of other instances from PostgreSQL: \(error)")
        }
    }

    package func reaches(_ target: OperationID, from ids: [OperationID]) throws(EngineError) -> Bool {
        do { return try store.reaches(target, from: ids) } catch {
            throw .unavailable("cannot read operations of other instances from PostgreSQL: \(error)")
        }
    }

    package func watch(_ ids: [OperationID]) {
        watched.withLock { w in for id in ids { w.insert(id.raw) } }
        // The look after the wait exists (see `RemoteOperations`); looks asked for meanwhile
        // are one look.
        lookSoon(ids)
    }

    private func lookSoon(_ ids: [OperationID]) {
        let schedule = due.withLock { d -> Bool in
            for id in ids { d.ids.insert(id.raw) }
            defer { d.scheduled = true }
            return !d.scheduled
        }
        guard schedule else { return }
        checks.async { [self] in
            while true {
                let batch: [OperationID] = due.withLock { d in
                    let out = d.ids.prefix(1000).map { OperationID(raw: $0) }
                    for id in out { d.ids.remove(id.raw) }
                    if out.isEmpty { d.scheduled = false }
                    return out
                }
                if batch.isEmpty { return }
                check(batch)
            }
        }
    }

    /// From the feed: every event of every instance, in seq order. An end of an operation
    /// waited for is looked at in PostgreSQL before it is reported: the event does not say
    /// whether a cascade cancelled it (its row does, `cascade_at`).
    package func eventsPublished(_ batch: [ChangeEvent]) {
        let ended: [OperationID] = watched.withLock { w in
            guard !w.isEmpty else { return [] }
            var out: [OperationID] = []
            for e in batch where e.key == .isFinished && e.new == .bool(true) && w.contains(e.operation.raw) {
                out.append(e.operation)
            }
            return out
        }
        if !ended.isEmpty { lookSoon(ended) }
    }

    private func check(_ ids: [OperationID]) {
        guard !ids.isEmpty, let states = try? store.operationStates(ids) else { return }
        // Ids of no operation (purged meanwhile) count as finished: nothing would report them.
        let ended = ids.filter { states.finished[$0] ?? true }
        guard !ended.isEmpty else { return }
        watched.withLock { w in for id in ended { w.remove(id.raw) } }
        engine?.remoteOperationsFinished(ended, cascades: states.cascades)
    }

    /// Every period: the operations still waited for, looked at again (a feed that was cut off
    /// may have missed an end); those now held here are local edges already.
    private func reconcile(_ engine: QueueEngine) {
        let waited = engine.remoteWaitedFor
        watched.withLock { $0 = Set(waited.map(\.raw)) }
        if !waited.isEmpty { lookSoon(waited) }
    }
}

/// The count of unclean stops (`countCrashes`) did not commit in time: the partitions
/// are given back rather than run without it.
struct CrashCountNotCommitted: Error, CustomStringConvertible {
    var description: String { "the count of unclean stops of the partitions taken was not committed within a third of a lease" }
}
