import QueueEngine

// MARK: - spec

/// A checked `command` spec.
struct CommandSpec: Sendable {
    var argv: [String]
    var env: [(String, String)]
    var cwd: String?
    var timeout: Double

    static let fields = ["argv", "env", "cwd", "timeout"]

    init(_ spec: JSONValue?) throws(EngineError) {
        let shape = "{\"argv\": [\"/absolute/path\", ...], \"env\"?, \"cwd\"?, \"timeout\"?}"
        let spec = try specObject(spec, kind: "command", shape: shape, fields: Self.fields)
        guard let a = spec["argv"] else {
            throw .invalidArgument(field: "spec.argv", detail: "is required: a non-empty array of strings, the first an absolute path")
        }
        guard case let .array(items) = a, !items.isEmpty else {
            throw .invalidArgument(field: "spec.argv", detail: "must be a non-empty array of strings, the first an absolute path; got \(a.text)")
        }
        argv = []
        for (i, item) in items.enumerated() {
            guard case let .string(s) = item else {
                throw .invalidArgument(field: "spec.argv[\(i)]", detail: "must be a string; got \(item.typeName)")
            }
            guard !s.utf8.contains(0) else { throw .invalidArgument(field: "spec.argv[\(i)]", detail: "must not contain NUL") }
            argv.append(s)
        }
        guard argv[0].utf8.first == UInt8(ascii: "/") else {
            throw .invalidArgument(field: "spec.argv[0]", detail: "must be an absolute path (no PATH lookup); got \(JSONValue.string(argv[0]).text)")
        }

        env = []
        if let e = spec["env"] {
            guard case let .object(pairs) = e else {
                throw .invalidArgument(field: "spec.env", detail: "must be an object of strings {\"NAME\": \"value\"}; got \(e.typeName)")
            }
            for (name, value) in pairs {
                guard !name.isEmpty, !name.utf8.contains(UInt8(ascii: "=")), !name.utf8.contains(0) else {
                    throw .invalidArgument(field: "spec.env", detail: "variable name \(JSONValue.string(name).text) must be non-empty without '=' or NUL")
                }
                guard case let .string(v) = value, !v.utf8.contains(0) else {
                    throw .invalidArgument(field: "spec.env.\(name)", detail: "must be a string without NUL; got \(value.text)")
                }
                env.append((name, v))
            }
        }

        cwd = nil
        if let c = spec["cwd"] {
            guard case let .string(path) = c, path.utf8.first == UInt8(ascii: "/"), !path.utf8.contains(0) else {
                throw .invalidArgument(field: "spec.cwd", detail: "must be an absolute path of an existing directory; got \(c.text)")
            }
            cwd = path
        }

        timeout = CommandKind.defaultTimeout
        if let t = spec["timeout"] { timeout = try HTTPSpec.timeout(t, field: "spec.timeout") }
    }

    /// The child's whole environment, `NAME=value` each.
    var environment: [String] {
        var out = env.map { "\($0.0)=\($0.1)" }
        if !env.contains(where: { $0.0 == "PATH" }) { out.append("PATH=\(CommandKind.defaultPath)") }
        return out
    }
}
