/// Which loop receives a listening port (`NamedPort`, `NetworkPort`), and
/// how many times the port was added to each of its modes: a port is one
/// loop's, claimed by the first `schedule`, and its sources leave a mode
/// when the last add there is removed. Not thread-safe: its port keeps it
/// under the port's lock.
struct PortLoopMembership {
    private var claimed: ObjectIdentifier?
    /// The claiming loop, while it lives.
    private(set) weak var loop: ThreadLoop?
    private var modes: [LoopMode: Int] = [:]

    /// Counts one add of the port to `mode` of `loop`, claiming the port
    /// for `loop` if no loop has it. False, counting nothing, if another
    /// loop has it.
    mutating func join(_ loop: ThreadLoop, forMode mode: LoopMode) -> Bool {
        if claimed == nil {
            claimed = ObjectIdentifier(loop)
            self.loop = loop
        }
        guard claimed == ObjectIdentifier(loop) else { return false }
        modes[mode, default: 0] += 1
        return true
    }

    /// Counts one removal from `mode` of `loop`; true when it was the last
    /// add there, so the port's sources leave that mode.
    mutating func leave(_ loop: ThreadLoop, forMode mode: LoopMode) -> Bool {
        guard claimed == ObjectIdentifier(loop), let n = modes[mode] else { return false }
        modes[mode] = n > 1 ? n - 1 : nil
        return n == 1
    }

    /// The modes the port is in, for a source made later (a new connection).
    var currentModes: [LoopMode] { Array(modes.keys) }
}
