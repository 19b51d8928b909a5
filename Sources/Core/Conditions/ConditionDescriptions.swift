// Short descriptions of the condition handles, as the lock handles have
// (`Locks/LockDescriptions.swift`, whose `namePrefix` they share): each
// reads the words once, relaxed; it never blocks, orders nothing, and may
// be stale by the time it is printed.

extension Condition: CustomStringConvertible {
    /// `Condition(unlocked)` or `Condition(locked)`; a named condition shows
    /// its name first: `Condition("mailbox", locked)`.
    public var description: String {
        let word = AtomicMemory.load(from: mutex.word, ordering: .relaxed)
        return "Condition(\(namePrefix(name))\(word & LockWord.locked != 0 ? "locked" : "unlocked"))"
    }
}

extension ConditionLock: CustomStringConvertible {
    /// `ConditionLock(unlocked, condition: 0)` or `ConditionLock(locked,
    /// condition: 2)`; a named lock shows its name first.
    public var description: String {
        let locked = AtomicMemory.load(from: held, ordering: .relaxed) != 0
        let value = AtomicMemory.load(from: conditionWord, ordering: .relaxed)
        return "ConditionLock(\(namePrefix(name))\(locked ? "locked" : "unlocked"), condition: \(value))"
    }
}

extension Semaphore: CustomStringConvertible {
    /// `Semaphore(value: 2)`: the count now (negative: that many waiters);
    /// a named semaphore shows its name first: `Semaphore("slots", value: 2)`.
    public var description: String {
        "Semaphore(\(namePrefix(name))value: \(AtomicMemory.load(from: count, ordering: .relaxed)))"
    }
}
