/// Admission (API.md "Admission: debounce and singleton"): what a create may ask about the
/// operations already in its queue before it adds one.
public enum Admission: Sendable, Equatable {
    /// While an operation created with the same key has not started, a create replaces its spec
    /// and options and moves its start to `seconds` from now, never later than `maxSeconds`
    /// after the first create it absorbed.
    case debounce(key: String, seconds: Double, maxSeconds: Double)
    /// At most one unfinished operation per key (`skip`), or one started and one waiting
    /// (`replaceWaiting`).
    case singleton(key: String, mode: SingletonMode)

    public var key: String {
        switch self {
        case let .debounce(key, _, _), let .singleton(key, _): key
        }
    }

    /// As a create body has it: `{"debounce": {"key", "seconds", "maxSeconds"}}` or
    /// `{"singleton": {"key", "mode"}}` (a schedule's template keeps it so).
    public var json: JSONValue {
        switch self {
        case let .debounce(key, seconds, maxSeconds):
            .object([("debounce", .object([("key", .string(key)), ("seconds", .number(seconds)), ("maxSeconds", .number(maxSeconds))]))])
        case let .singleton(key, mode):
            .object([("singleton", .object([("key", .string(key)), ("mode", .string(mode.rawValue))]))])
        }
    }

    /// `json` back; nil for anything else (a store's value this server never wrote).
    public init?(json v: JSONValue) {
        if let d = v["debounce"], case let .string(key)? = d["key"], case let .number(s)? = d["seconds"], case let .number(m)? = d["maxSeconds"],
            AdmissionTag.isKey(key), Self.secondsRange.contains(s), m >= s, m <= Self.maxSecondsLimit
        {
            self = .debounce(key: key, seconds: s, maxSeconds: m)
        } else if let g = v["singleton"], case let .string(key)? = g["key"], case let .string(m)? = g["mode"], AdmissionTag.isKey(key),
            let mode = SingletonMode(rawValue: m)
        {
            self = .singleton(key: key, mode: mode)
        } else {
            return nil
        }
    }

    /// Keys are 1 to 128 characters.
    public static let maxKeyLength = 128
    /// `debounce.seconds`, and the most `maxSeconds` may be.
    public static let secondsRange: ClosedRange<Double> = 0.001...604_800
    public static let maxSecondsLimit = 31_536_000.0
}

public enum SingletonMode: String, Sendable, CaseIterable {
    case skip, replaceWaiting
}

/// What a create with an admission did: the answer's `"admission"`.
public enum AdmissionOutcome: String, Sendable {
    /// A new operation (201).
    case created
    /// An operation that had not started took its spec (200).
    case merged
    /// Nothing was added: an unfinished operation of the key stands for it (200).
    case skipped
}

/// What an operation created with an admission carries, stored with it: a restart rebuilds
/// its queue's index of keys from it.
public struct AdmissionTag: Sendable, Equatable {
    public enum Mode: String, Sendable { case debounce, singleton }
    public var mode: Mode
    public var key: String
    /// `debounce`: when the first create it stands for was made (the `maxSeconds` cap counts
    /// from it).
    public var since: Timestamp?
    public init(mode: Mode, key: String, since: Timestamp? = nil) { self.mode = mode; self.key = key; self.since = since }

    /// The stored text: `debounce <since ns> <key>` or `singleton <key>` (the key last, whole).
    public var text: String {
        switch mode {
        case .debounce: "debounce \(since?.nanoseconds ?? 0) \(key)"
        case .singleton: "singleton \(key)"
        }
    }

    /// The stored text back; nil for text this server never writes.
    public init?(text: String) {
        let parts = text.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        switch parts.first {
        case "debounce":
            guard parts.count == 3, let ns = Int64(parts[1]), ns >= 0 else { return nil }
            self.init(mode: .debounce, key: String(parts[2]), since: Timestamp(nanoseconds: ns))
        case "singleton":
            guard parts.count >= 2 else { return nil }
            self.init(mode: .singleton, key: parts.dropFirst().joined(separator: " "))
        default:
            return nil
        }
        guard Self.isKey(key) else { return nil }
    }

    /// 1 to 128 characters, none a control character (and at most 1 KiB: a character may be
    /// many scalars, and counting characters costs their length).
    public static func isKey(_ key: String) -> Bool {
        !key.isEmpty && key.utf8.count <= 1024 && !key.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
            && key.count <= Admission.maxKeyLength
    }
}

/// An operation and what its create's admission did.
public struct Admitted: Sendable {
    public var operation: OperationSnapshot
    /// nil: the create asked for no admission.
    public var outcome: AdmissionOutcome?
    public init(operation: OperationSnapshot, outcome: AdmissionOutcome?) { self.operation = operation; self.outcome = outcome }
}

/// A queue's operations by admission key, for the creates that name one. Entries are checked
/// when looked at (a debounced one that started no longer absorbs) and dropped when their
/// operation finishes.
final class AdmissionIndex: @unchecked Sendable {  // guarded by the engine lock
    /// The newest operation of each debounce key.
    var debounce: [String: OpRecord] = [:]
    /// The unfinished operations of each singleton key, oldest first (at most two).
    var singleton: [String: [OpRecord]] = [:]

    var isEmpty: Bool { debounce.isEmpty && singleton.isEmpty }

    func add(_ op: OpRecord, _ tag: AdmissionTag) {
        switch tag.mode {
        case .debounce: debounce[tag.key] = op
        case .singleton: singleton[tag.key, default: []].append(op)
        }
    }

    func remove(_ op: OpRecord, _ tag: AdmissionTag) {
        switch tag.mode {
        case .debounce:
            if debounce[tag.key] === op { debounce[tag.key] = nil }
        case .singleton:
            guard var list = singleton[tag.key] else { return }
            list.removeAll { $0 === op }
            singleton[tag.key] = list.isEmpty ? nil : list
        }
    }
}

final class AdmissionTagBox: Sendable {
    let tag: AdmissionTag
    init(_ tag: AdmissionTag) { self.tag = tag }
}
