import Foundation
import Schedules
import Testing

/// The daylight-saving rule against an independent oracle (Python's zoneinfo and a cron matcher
/// of its own, minute by minute: `dst_oracle.py`), for New York, Berlin and Lord Howe (a
/// 30-minute shift) around their changes in 2026 and 2027.
@Suite struct DaylightSavingTests {
    struct Case: Codable {
        var cron: String
        var zone: String
        var from: Int64
        var count: Int
    }

    static func unix(_ iso: String) -> Int64 {
        let f = ISO8601DateFormatter()
        return Int64(f.date(from: iso)?.timeIntervalSince1970 ?? 0)
    }

    static let cases: [Case] = {
        // A day before each change.
        let changes: [(String, String)] = [
            ("America/New_York", "2026-03-07T12:00:00Z"), ("America/New_York", "2026-10-31T12:00:00Z"),
            ("Europe/Berlin", "2026-03-28T12:00:00Z"), ("Europe/Berlin", "2026-10-24T12:00:00Z"),
            ("Australia/Lord_Howe", "2026-04-04T00:00:00Z"), ("Australia/Lord_Howe", "2026-10-03T00:00:00Z"),
            ("America/New_York", "2027-03-13T12:00:00Z"), ("Australia/Lord_Howe", "2027-10-02T00:00:00Z"),
        ]
        let crons = [
            "30 2 * * *", "0 2 * * *", "30 1 * * *", "45 1 * * *", "15 2 * * *", "0 3 * * *", "*/30 * * * *", "*/15 1-3 * * *",
            "0 */2 * * *", "59 1 * * 0",
        ]
        var out: [Case] = []
        for (zone, at) in changes {
            for cron in crons { out.append(Case(cron: cron, zone: zone, from: unix(at), count: cron.hasPrefix("*") ? 80 : 4)) }
        }
        return out
    }()

    @Test func theRuleAgreesWithZoneinfo() throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("dst_oracle.py").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", script]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(try JSONEncoder().encode(Self.cases))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let expected = try #require(try JSONSerialization.jsonObject(with: data) as? [[[Any]]])
        #expect(expected.count == Self.cases.count)
        var notes = Set<String>()
        for (c, want) in zip(Self.cases, expected) {
            let zone = try #require(Zone.load(c.zone), "\(c.zone) in the system's tz database")
            let cron = try Cron(c.cron)
            let got = Occurrences.next(cron, in: zone, after: c.from, count: c.count)
            let wantPairs = want.map { "\(($0[0] as? NSNumber)?.int64Value ?? -1) \($0[1] as? String ?? "-")" }
            let gotPairs = got.map { "\($0.utc) \($0.note?.rawValue ?? "-")" }
            // The oracle walks 4 days: it may list fewer than asked.
            #expect(!wantPairs.isEmpty && Array(gotPairs.prefix(wantPairs.count)) == wantPairs, "\(c.cron) in \(c.zone) from \(c.from)")
            for o in got { if let n = o.note { notes.insert(n.rawValue) } }
        }
        #expect(notes == ["gap", "repeated"], "the cases reach both rules")
    }
}
