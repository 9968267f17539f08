import Foundation
import QueueEngine
import SQLiteStore
import TestKit
import Testing

/// Set in the child process of `acknowledgedWritesSurviveKill9`: the store directory.
private let crashChildDirectory = ProcessInfo.processInfo.environment["OPQD_STORE_CRASH_CHILD"]

@Suite struct CrashTests {
    /// Re-runs this test binary as a child that writes create-like batches with sync `full`
    /// and logs each ticket as `whenDurable` reports it; kills it with SIGKILL mid-stream;
    /// then checks that every acknowledged ticket is in the store.
    @Test(.enabled(if: crashChildDirectory == nil), .timeLimit(.minutes(2)))
    func acknowledgedWritesSurviveKill9() throws {
        #if os(Linux)
        try withTemporaryDirectory { dir in
            let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
            var environment = ProcessInfo.processInfo.environment
            environment["OPQD_STORE_CRASH_CHILD"] = dir.path
            let child = try ChildProcess(
                exe, ["--testing-library", "swift-testing", "--filter", "childWritesUntilKilled"],
                environment: environment)

            let acks = dir.file("acks")
            func acknowledged() -> [UInt64] {
                guard let text = try? String(contentsOfFile: acks, encoding: .utf8) else { return [] }
                // The last line may be cut short by the kill.
                return text.split(separator: "\n", omittingEmptySubsequences: true).dropLast().compactMap { UInt64($0) }
            }
            let deadline = Date().addingTimeInterval(60)
            while acknowledged().count < 5000 && child.isRunning && Date() < deadline { usleep(10_000) }
            #expect(child.isRunning, "the child stopped by itself")
            child.signal(SIGKILL)
            #expect(child.terminatingSignal == SIGKILL)

            let acked = acknowledged()
            let highest = try #require(acked.max())
            #expect(acked.count >= 5000)
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            let state = try store.load()
            let ids = Set(state.operations.map(\.id.raw))
            let missing = (1...highest).filter { !ids.contains($0) }
            #expect(missing.isEmpty, "\(missing.count) acknowledged operations lost, first \(missing.prefix(5))")
            #expect(state.lastSeq >= highest)
            #expect(state.queues.map(\.name) == ["q"])
        }
        #endif
    }

    /// The child side of `acknowledgedWritesSurviveKill9`; skipped in a normal run.
    @Test(.enabled(if: crashChildDirectory != nil, "runs only as the child of acknowledgedWritesSurviveKill9"))
    func childWritesUntilKilled() throws {
        guard let dir = crashChildDirectory else { return }
        let store = try SQLiteStore(directory: dir, sync: .full)
        let fd = open(dir + "/acks", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        store.append([.queue(queueSnapshot("q"))], upTo: 0)
        // Bounded, so that a child whose parent died cannot run away: at most 20,000 tickets
        // in flight, at most 30 s, and it stops when it is orphaned.
        let parent = getppid()
        let deadline = Date().addingTimeInterval(30)
        var i: UInt64 = 0
        while Date() < deadline && getppid() == parent {
            i += 1
            store.append([.event(event(i, i)), .operation(operationSnapshot(i))], upTo: i)
            store.whenDurable(i) { [i] in
                let line = Array("\(i)\n".utf8)
                _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            }
            while i > store.durableTicket + 20_000 { usleep(1000) }
            if i % 100 == 0 { usleep(200) }
        }
        store.close()
    }
}
