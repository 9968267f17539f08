import Dispatch
import QueueEngine
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What `SQLiteStore.selfBenchmark` measured for one sync mode.
public struct StoreBenchmarkResult: Sendable, CustomStringConvertible {
    /// The sync mode measured.
    public let sync: SyncMode
    /// Create-like batches appended (each one operation upsert and one event).
    public let batches: Int
    /// Records committed.
    public let records: Int
    /// Transactions the writer needed for them.
    public let commits: Int
    /// From the first append to the last `whenDurable` callback.
    public let seconds: Double
    /// CPU seconds the writer thread spent in transactions.
    public let writerCPUSeconds: Double
    /// Tickets allowed in flight (appended but not yet durable), like concurrent clients.
    public let window: Int

    /// Durable creates per second.
    public var batchesPerSecond: Double { Double(batches) / seconds }
    /// Records committed per second.
    public var recordsPerSecond: Double { Double(records) / seconds }

    /// Writer CPU time per create, in microseconds: what a create costs the writer
    /// whatever else the machine is doing.
    public var writerMicrosPerCreate: Double { writerCPUSeconds * 1e6 / Double(batches) }

    /// One line for a benchmark report.
    public var description: String {
        let perCommit = commits == 0 ? 0 : records / commits
        return "store sync=\(sync.rawValue) window=\(window): \(batches) creates (\(records) records) durable in \(format3(seconds)) s: "
            + "\(Int(batchesPerSecond)) creates/s, \(Int(recordsPerSecond)) records/s, \(commits) commits (~\(perCommit) records each), "
            + "writer CPU \(format3(writerMicrosPerCreate)) us/create"
    }
}

private func format3(_ v: Double) -> String {
    let ms = Int((v * 1000).rounded())
    let frac = ms % 1000
    return "\(ms / 1000)." + (frac < 10 ? "00" : frac < 100 ? "0" : "") + "\(frac)"
}

extension SQLiteStore {
    /// Measures the writer alone: one thread appends `batches` create-like batches (an
    /// operation upsert and its creation event, as the engine's drainer would) and asks for
    /// each ticket's durability, as the API does, keeping at most `window` tickets in flight
    /// (as `window` concurrent clients would); the clock stops at the last callback. Runs
    /// with sync `full` and `normal` in fresh temporary stores under `directory` (default
    /// `$TMPDIR` or `/tmp`), prints a line per mode and returns the figures.
    @discardableResult
    public static func selfBenchmark(batches: Int = 200_000, window: Int = 1000, directory: String? = nil,
                                     print shouldPrint: Bool = true) -> [StoreBenchmarkResult] {
        var results: [StoreBenchmarkResult] = []
        for mode in [SyncMode.full, .normal] {
            let base = directory ?? (getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp")
            var template = Array("\(base)/opqd-store-bench-XXXXXX".utf8CString)
            guard let made = mkdtemp(&template) else { continue }
            let dir = String(cString: made)
            defer {
                for f in ["opqd.sqlite", "opqd.sqlite-wal", "opqd.sqlite-shm", "opqd.lock"] { unlink(dir + "/" + f) }
                rmdir(dir)
            }
            guard let store = try? SQLiteStore(directory: dir, sync: mode) else { continue }
            let result = store.runBenchmark(batches: batches, window: max(1, window))
            store.close()
            if shouldPrint { Swift.print(result) }
            results.append(result)
        }
        return results
    }

    private func runBenchmark(batches: Int, window: Int) -> StoreBenchmarkResult {
        let now = SystemClock().now()
        let queue = QueueSnapshot(name: "bench", maxConcurrentOperationCount: -1, effectiveMaxConcurrentOperationCount: 4,
                                  isSuspended: false, operationCount: 0, counts: [:], revision: 1, createdAt: now)
        var op = OperationSnapshot(
            id: OperationID(raw: 1), queue: "bench", name: nil, kind: "delay", spec: .object([("seconds", .number(1))]),
            state: .ready, outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
            attempt: 0, result: nil, error: nil, createdAt: now, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
        let before = stats
        let done = DispatchSemaphore(value: 0)
        let total = UInt64(batches)
        let start = DispatchTime.now().uptimeNanoseconds
        append([.queue(queue)], upTo: 0)
        for i in 1...total {
            op.id = OperationID(raw: i)
            let event = ChangeEvent(seq: i, time: now, queue: "bench", operation: op.id, key: .isReady, old: .none, new: .bool(true), state: .ready)
            append([.event(event), .operation(op)], upTo: i)
            whenDurable(i) { if i == total { done.signal() } }
            if i > UInt64(window) && i - UInt64(window) > durableTicket {
                let room = DispatchSemaphore(value: 0)
                whenDurable(i - UInt64(window)) { room.signal() }
                room.wait()
            }
        }
        done.wait()
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        let after = stats
        return StoreBenchmarkResult(sync: sync, batches: batches, records: after.records - before.records,
                                    commits: after.commits - before.commits, seconds: seconds,
                                    writerCPUSeconds: after.cpuSeconds - before.cpuSeconds, window: window)
    }
}
