// Short descriptions of the run-loop handles, for logs and debuggers: what
// the object is and its state, never its internals. Each reads its state
// the way its documented properties do (a snapshot from another thread).

extension ThreadLoop: CustomStringConvertible {
    /// `ThreadLoop(thread 1234, io_uring, running in default)`, or `… idle)`
    /// when no `run` is in progress.
    public var description: String {
        let state = currentMode.map { "running in \($0)" } ?? "idle"
        return "ThreadLoop(thread \(ownerThreadID), \(backendKind.rawValue), \(state))"
    }
}

extension LoopSource: CustomStringConvertible {
    /// `LoopSource(custom, signalled)`, `LoopSource(descriptor 7, readable)`,
    /// with `invalid` or the failure when it can no longer fire.
    public var description: String {
        var parts: [String]
        switch kind {
        case .custom:
            parts = ["custom"]
            if isSignaled { parts.append("signalled") }
        case .descriptor(let fd, let interest):
            var wanted: [String] = []
            if interest.contains(.readable) { wanted.append("readable") }
            if interest.contains(.writable) { wanted.append("writable") }
            parts = ["descriptor \(fd)", wanted.joined(separator: " and ")]
        }
        if let failure {
            parts.append("failed: \(failure)")
        } else if !isValid {
            parts.append("invalid")
        }
        return "LoopSource(\(parts.joined(separator: ", ")))"
    }
}

extension LoopTimer: CustomStringConvertible {
    /// `LoopTimer(one-shot, due in 4.99 ms)`, `LoopTimer(every 1 ms, due in
    /// 0.2 ms)`, or `LoopTimer(…, invalid)`.
    public var description: String {
        let kind = interval.map { "every \($0)" } ?? "one-shot"
        guard isValid else { return "LoopTimer(\(kind), invalid)" }
        let date = fireDate
        let due = date.isDistantFuture ? "never due" : "due in \(MonotonicClock.now.duration(to: date))"
        return "LoopTimer(\(kind), \(due))"
    }
}

extension LoopObserver: CustomStringConvertible {
    /// `LoopObserver(beforeWaiting, afterWaiting, repeats)`, or `… once)`,
    /// with `invalid` once it can no longer run.
    public var description: String {
        "LoopObserver(\(activities), \(repeats ? "repeats" : "once")\(isValid ? "" : ", invalid"))"
    }
}
