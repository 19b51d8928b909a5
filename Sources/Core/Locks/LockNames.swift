import Synchronization

/// The names given to locks, conditions and semaphores (`Lock.name`,
/// `RecursiveLock.name`, `Condition.name`, `ConditionLock.name`,
/// `Semaphore.name`), kept beside them instead of in them.
///
/// Why a side table: a name is read only by `description` and by misuse
/// messages, never by `lock()`/`unlock()`, and most locks are never named. A
/// field in each lock's storage would make every unnamed lock bigger (a
/// `Lock` is 32 bytes on the heap; an optional `String` adds 16, and glibc
/// would hand it a 64-byte block instead of 48), and the uncontended paths
/// would not use it. So the table maps the address of a lock's first word
/// (stable for the lock's life) to its name; each storage object's `deinit`
/// removes its entry, so an address reused by a later lock starts unnamed.
///
/// Cost: setting or reading a name takes the table's lock. A lock's deinit
/// reads one atomic counter (relaxed) and touches the table only while some
/// lock in the process has a name. Setting a name happens-before the
/// storage's deinit (the last reference is released after the setter
/// returned), so the relaxed count cannot miss that lock's own entry.
@usableFromInline
enum LockNames {
    /// How many entries the table holds; the deinit's gate.
    static let entries = Atomic<Int>(0)
    /// Name by word address.
    static let table = LockedValue<[UInt: String]>([:])

    static func key(_ word: UnsafeRawPointer) -> UInt { UInt(bitPattern: word) }

    /// The name of the lock whose first word is at `word`, if it has one.
    static func name(at word: UnsafeRawPointer) -> String? {
        if entries.load(ordering: .relaxed) == 0 { return nil }
        return table.withLock { $0[key(word)] }
    }

    /// Names (or, for nil, unnames) the lock whose first word is at `word`.
    static func setName(_ name: String?, at word: UnsafeRawPointer) {
        // A process with named locks empties the table in a child after
        // `fork()` (`childAfterFork`).
        _ = forkHandlersRegistered
        table.withLock { table in
            let before = table.count
            table[key(word)] = name
            entries.add(table.count - before, ordering: .relaxed)
        }
    }

    /// Called by a storage object's deinit: drops its entry.
    static func forget(_ word: UnsafeRawPointer) {
        if entries.load(ordering: .relaxed) == 0 { return }
        table.withLock { table in
            if table.removeValue(forKey: key(word)) != nil {
                entries.subtract(1, ordering: .relaxed)
            }
        }
    }

    /// The table's fork handlers: made in the parent before each fork, so
    /// the child's handler allocates nothing; emptied in the child.
    static let forkHandlersRegistered: Void = {
        ForkHandlers.register(.locks, prepare: { _ = LockNames.table }, child: { _ in LockNames.childAfterFork() })
    }()

    /// In a child after `fork()` (`ForkHandlers`' child handler, the only
    /// thread): a thread of the parent may have held the table's lock, in
    /// the middle of a change, and nobody would release it here, so the
    /// next lock the child frees (whose deinit calls `forget`) would wait
    /// for good. The table is left in memory unreleased (it may be half
    /// changed) and replaced by an empty one, its lock freed: in the child,
    /// the parent's locks are unnamed. Takes no lock, allocates nothing
    /// (the table was made in the parent, by the prepare handler).
    static func childAfterFork() {
        table.valuePointer.initialize(to: [:])
        table.storage.withUnsafeMutablePointerToElements { $0.update(repeating: 0, count: FutexMutex.wordCount) }
        entries.store(0, ordering: .relaxed)
    }

    /// `Lock "db"` for a named lock, `Lock` otherwise: how misuse messages
    /// and descriptions name the lock. Only misuse paths and `description`
    /// call it.
    @usableFromInline
    @inline(never)
    static func label(_ kind: String, _ word: UnsafeRawPointer) -> String {
        guard let name = name(at: word) else { return kind }
        return "\(kind) \"\(name)\""
    }
}
