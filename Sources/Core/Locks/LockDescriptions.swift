// Short descriptions of the lock handles, so that `print(lock)` says what a
// user can act on (held or not) instead of dumping storage. Each reads the
// lock's words once, relaxed: it never blocks, orders nothing, and may be
// stale by the time it is printed.

extension Lock: CustomStringConvertible {
    /// `Lock(unlocked)`, `Lock(locked)`, or `Lock(locked, contended)` while
    /// other threads wait for it; a named lock shows its name first:
    /// `Lock("db", locked)`.
    public var description: String {
        let word = AtomicMemory.load(from: mutex.word, ordering: .relaxed)
        let state: String
        if word & LockWord.locked == 0 {
            state = "unlocked"
        } else {
            let contended = word & LockWord.parked != 0 || mutex.threadsWaitingForTurn > 0
            state = contended ? "locked, contended" : "locked"
        }
        return "Lock(\(namePrefix(name))\(state))"
    }
}

extension RecursiveLock: CustomStringConvertible {
    /// `RecursiveLock(unlocked)`, `RecursiveLock(locked)`, or
    /// `RecursiveLock(locked by the calling thread)`; a named lock shows its
    /// name first: `RecursiveLock("db", locked)`.
    public var description: String {
        let prefix = "RecursiveLock(" + namePrefix(name)
        if isHeldByCurrentThread { return prefix + "locked by the calling thread)" }
        let word = AtomicMemory.load(from: core.mutex.word, ordering: .relaxed)
        return prefix + (word & LockWord.locked != 0 ? "locked)" : "unlocked)")
    }
}

extension SpinLock: CustomStringConvertible {
    /// `SpinLock(unlocked)` or `SpinLock(locked)`.
    public var description: String {
        AtomicMemory.load(from: word, ordering: .relaxed) != 0 ? "SpinLock(locked)" : "SpinLock(unlocked)"
    }
}

extension ReadWriteLock: CustomStringConvertible {
    /// `ReadWriteLock(unlocked)`, `ReadWriteLock(write-locked)` or
    /// `ReadWriteLock(read-locked by N)`.
    public var description: String {
        let holders = AtomicMemory.load(from: state, ordering: .relaxed) & Self.mask
        switch holders {
        case 0: return "ReadWriteLock(unlocked)"
        case Self.writeLocked: return "ReadWriteLock(write-locked)"
        default: return "ReadWriteLock(read-locked by \(holders))"
        }
    }
}

/// `"name", ` for a named lock, nothing for an unnamed one.
func namePrefix(_ name: String?) -> String {
    name.map { "\"\($0)\", " } ?? ""
}
