// Report formatting of the benchmarks: numbers, columns, percentiles, one-line JSON.
import Foundation

extension BenchSupport {
    static func fmt(_ v: Double, _ decimals: Int = 0) -> String { String(format: "%.\(decimals)f", v) }

    static func grouped(_ v: Double) -> String {
        let n = Int(v.rounded())
        let s = String(abs(n))
        var out = ""
        for (i, c) in s.reversed().enumerated() {
            if i > 0 && i % 3 == 0 { out.append(",") }
            out.append(c)
        }
        return (n < 0 ? "-" : "") + String(out.reversed())
    }

    static func pad(_ s: String, _ width: Int, right: Bool = false) -> String {
        if s.count >= width { return s }
        let fill = String(repeating: " ", count: width - s.count)
        return right ? fill + s : s + fill
    }

    static func percentile(_ sorted: [Double], _ p: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        let i = min(sorted.count - 1, max(0, Int((p * Double(sorted.count)).rounded(.up)) - 1))
        return sorted[i]
    }

    static func round3(_ v: Double) -> Double { (v * 1000).rounded() / 1000 }

    /// One JSON object on one line, keys in the given order.
    static func jsonLine(_ pairs: [(String, Any)]) -> String {
        func enc(_ v: Any) -> String {
            switch v {
            case let b as Bool: return b ? "true" : "false"
            case let i as Int: return String(i)
            case let d as Double: return d.isFinite ? (d == d.rounded() && abs(d) < 1e15 ? String(Int(d)) : String(d)) : "null"
            case let s as String:
                let data = (try? JSONSerialization.data(withJSONObject: [s], options: [])) ?? Data("[\"\"]".utf8)
                let t = String(decoding: data, as: UTF8.self)
                return String(t.dropFirst().dropLast())
            case let o as [(String, Any)]: return "{" + o.map { enc($0.0) + ":" + enc($0.1) }.joined(separator: ",") + "}"
            case let a as [Any]: return "[" + a.map(enc).joined(separator: ",") + "]"
            case is NSNull: return "null"
            default: return "null"
            }
        }
        return enc(pairs)
    }

    static func parseJSON(_ bytes: [UInt8]) -> [String: Any]? {
        try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
    }

    static func int(_ v: Any?) -> Int? {
        if let i = v as? Int { return i }
        if let n = v as? NSNumber { return n.intValue }
        return nil
    }
}
