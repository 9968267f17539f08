import Dispatch
import StoreKit
import Synchronization
import Testing

/// ``CommitAftermath``: an idle writer runs the aftermath itself, but never ahead of one still
/// queued; `after` (a fence's report) keeps its place; `drain` waits for all.
@Suite struct CommitAftermathTests {
    @Test func anAftermathRunsInlineOnlyWhenTheWriterIsIdleAndNothingIsQueued() {
        let aftermath = CommitAftermath(label: "opqd.test.aftermath")
        let order = Mutex<[String]>([])
        let note: @Sendable (String) -> Void = { name in order.withLock { $0.append("\(name) \(aftermath.isCurrent ? "queued" : "inline")") } }
        let gate = DispatchSemaphore(value: 0)
        aftermath.run(writerIdle: true) { note("1") }
        #expect(order.withLock { $0 } == ["1 inline"], "an idle writer with nothing queued runs it at once")
        aftermath.run(writerIdle: false) {
            _ = gate.wait(timeout: .now() + 10)
            note("2")
        }
        // 2 waits on the queue: 3 is idle, but may not overtake it.
        aftermath.run(writerIdle: true) { note("3") }
        aftermath.after { note("fence") }
        aftermath.run(writerIdle: true) { note("4") }
        #expect(order.withLock { $0 } == ["1 inline"], "nothing ran past the blocked aftermath")
        gate.signal()
        aftermath.drain()
        #expect(order.withLock { $0 } == ["1 inline", "2 queued", "3 queued", "fence queued", "4 queued"])
        aftermath.run(writerIdle: true) { note("5") }
        aftermath.runsOnIdleWriter.store(false, ordering: .relaxed)
        aftermath.run(writerIdle: true) { note("6") }
        aftermath.drain()
        #expect(order.withLock { Array($0.suffix(2)) } == ["5 inline", "6 queued"])
    }
}
