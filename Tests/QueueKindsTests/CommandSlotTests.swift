import Foundation
import QueueEngine
import QueueKinds
import Testing

extension KindsTests {
    /// `--max-commands`: no client can make the server run more children at once.
    @Suite struct CommandSlots {
        @Test("with one slot, a second command waits until the first has exited")
        func secondWaitsForTheFirst() throws {
            let h = try Harness(allow: ["/bin/sh"], maxCommands: 1)
            // Each child appends its start and end time to the file: the intervals must not overlap.
            let log = NSTemporaryDirectory() + "slots-\(UInt32.random(in: 0...UInt32.max)).log"
            defer { unlink(log) }
            let spec = #"{"argv": ["/bin/sh", "-c", "echo start >> \#(log); sleep 0.3; echo end >> \#(log)"]}"#
            let a = try h.add("command", spec)
            let b = try h.add("command", spec)
            let c = try h.add("command", spec)
            for id in [a, b, c] { #expect(try h.wait(id).outcome == .succeeded) }
            let lines = (try String(contentsOfFile: log, encoding: .utf8)).split(separator: "\n")
            #expect(lines == ["start", "end", "start", "end", "start", "end"], "children overlapped: \(lines)")
        }

        @Test("cancelling a command that waits for a slot finishes it cancelled at once, and the slot line moves on")
        func cancelWhileWaiting() throws {
            let h = try Harness(allow: ["/bin/sh"], maxCommands: 1)
            let a = try h.add("command", #"{"argv": ["/bin/sh", "-c", "sleep 0.5"]}"#)
            let b = try h.add("command", #"{"argv": ["/bin/sh", "-c", "sleep 5"]}"#)
            let c = try h.add("command", #"{"argv": ["/bin/sh", "-c", "exit 0"]}"#)
            #expect(waitUntil(timeout: 5) { (try? h.state(a)) == .executing })
            _ = try h.engine.cancel(b)
            let cancelled = try h.wait(b, timeout: 2)
            #expect(cancelled.outcome == .cancelled)
            #expect(try h.wait(a).outcome == .succeeded)
            #expect(try h.wait(c, timeout: 5).outcome == .succeeded, "the cancelled one must not keep its place in line")
        }
    }
}
