import CShims

/// The watch of a file-system object source. One inotify instance serves
/// the sources on work queues (waited for in the pool's poller, whose
/// worker runs their calls); each loop with file-system sources has one of
/// its own (waited for in the loop's backend, whose thread runs their
/// calls), up to `LoopRegistries.maximum` loops, and the reactor thread
/// one for the sources of further loops. Each source's descriptor is watched
/// through `/proc/self/fd/N`, so the watch is on the inode and follows the
/// file through renames. Sources on the same file share the kernel watch
/// (inotify gives one watch descriptor per inode); the watch goes when the
/// last of them is cancelled.
///
/// inotify's events become `FileEvents` with the help of `fstat` on the
/// source's descriptor: an extension is a modification that grew the size;
/// a link change is an attribute change that changed the link count; a
/// deletion is the link count reaching 0 (inotify sends `IN_DELETE_SELF`
/// only after the last descriptor closes, and the source's is open). On a
/// directory, inotify's events for its entries (`IN_CREATE`, `IN_DELETE`,
/// `IN_MOVED_FROM`, `IN_MOVED_TO`) are a write of the directory, as a kqueue
/// vnode source reports them; a directory's size is not an extension. The
/// events inotify sends a directory watch about what happens inside its
/// entries (a file in it written or chmodded: `IN_MODIFY`, `IN_ATTRIB` with
/// the entry's name) are not the directory's, and are dropped.
final class FileSystemWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `home` and `stopped` are guarded by `lock`; the rest of
    // what is mutable by the registries' locks (taken inside `lock`, never
    // the other way round; both registries' during a move, one at a time;
    // `LoopRegistries`' lock before a loop's registry's).

    let descriptor: Int32
    let events: EventSource.FileEvents
    /// Whether the object is a directory (its entries' changes are writes).
    let isDirectory: Bool
    /// Whether the source asked for an event that only the object's size
    /// or link count tells (extend, link, delete while open); a source
    /// that did not makes no `fstat` per event.
    private let needsStat: Bool
    /// The size and link count last seen, under `seenLock` (a leaf lock:
    /// while the watch moves, both registries may translate events for it).
    private var size: Int64
    private var links: UInt64
    private let seenLock = GuardLock()
    fileprivate weak var source: EventSource?
    private let lock = GuardLock()
    /// The registry the watch is in, if any.
    private var home: Registry?
    /// Set by `stop`: a `start` or `move` that comes after it (a cancel
    /// racing the activation) registers nothing.
    private var stopped = false

    init(descriptor: Int32, events: EventSource.FileEvents) throws(EventSourceError) {
        require(descriptor >= 0, "EventSource.fileSystemObject: `descriptor` is \(descriptor); it must be an open descriptor")
        let stat = try EventSourceCalls.stat(descriptor)
        self.descriptor = descriptor
        self.events = events
        isDirectory = stat.type == EventSourceCalls.directory
        needsStat = !events.isDisjoint(with: [.extend, .link, .delete])
        size = stat.size
        links = stat.links
    }

    /// The inotify events that can produce `events`.
    var inotifyMask: UInt32 {
        var mask: UInt32 = 0
        if !events.isDisjoint(with: [.write, .extend]) { mask |= CSHIMS_IN_MODIFY }
        if isDirectory && !events.isDisjoint(with: [.write, .link]) { mask |= Self.entryChanges }
        if !events.isDisjoint(with: [.attributes, .link, .delete]) { mask |= CSHIMS_IN_ATTRIB | CSHIMS_IN_DELETE_SELF }
        if events.contains(.rename) { mask |= CSHIMS_IN_MOVE_SELF }
        return mask
    }

    /// A directory's entry events: one made, removed, or renamed out or in.
    private static let entryChanges = CSHIMS_IN_CREATE | CSHIMS_IN_DELETE | CSHIMS_IN_MOVED_FROM | CSHIMS_IN_MOVED_TO

    func start(for source: EventSource, at placement: WatchPlacement) {
        enter(placement, for: source, moving: false)
    }

    /// Moves the watch to the inotify instance of another place, joining
    /// the new one before it leaves the old one: an event in between is
    /// queued in both instances (merged into the source twice at worst: the
    /// data is or-ed), and what the old instance has queued but not yet
    /// delivered is read and delivered as it is left. So no change is lost
    /// to the move. A move to a place served by the same instance (another
    /// mode of the same loop; another loop while both wait on the reactor)
    /// keeps the registration.
    func move(for source: EventSource, to placement: WatchPlacement) {
        enter(placement, for: source, moving: true)
    }

    /// Runs between joining the new registry and leaving the old one in a
    /// move (tests: a change made there must be delivered).
    static let moveProbe = LockedValue<(@Sendable () -> Void)?>(nil)

    private func enter(_ placement: WatchPlacement, for source: EventSource, moving: Bool) {
        let outcome: Result<Registry, EventSourceError>? = lock.withLock {
            guard !stopped, moving == (home != nil) else { return nil }
            let next: Registry
            do throws(EventSourceError) {
                next = try Registry.add(self, for: source, at: placement, leaving: home)
            } catch {
                // Still watched where it was; the failure cancels the source.
                return .failure(error)
            }
            if let previous = home, previous !== next {
                if let probe = Self.moveProbe.withLock({ $0 }) { probe() }
                previous.remove(self, deliveringPending: true)
            }
            home = next
            return .success(next)
        }
        // Outside the lock: failing cancels, and cancelling stops; a loop
        // that cannot watch the instance fails its sources.
        switch outcome {
        case .success(let registry):
            if case .loop(_, let modes) = placement, let failure = registry.attach(modes) { source.fail(failure) }
        case .failure(let error): source.fail(error)
        case nil: break
        }
    }

    var placementName: String? {
        lock.withLock { home?.placeName }
    }

    func stop() {
        lock.withLock {
            stopped = true
            home?.remove(self)
            home = nil
        }
    }

    /// The `FileEvents` that `mask` (from inotify) means for this watch,
    /// with the size and link count it last saw brought up to date. Under
    /// a registry's lock.
    fileprivate func translate(_ mask: UInt32) -> EventSource.FileEvents {
        var found: EventSource.FileEvents = []
        if mask & CSHIMS_IN_ENTRY != 0 {
            // About an entry of this directory: a change of the directory
            // only if the entry was made, removed or renamed; a write to a
            // file in it (or its chmod) is the file's, not the directory's.
            guard mask & Self.entryChanges != 0 else { return [] }
            found.insert(.write)
        }
        // Only a source that asked for what only `fstat` tells looks.
        let stat = needsStat ? try? EventSourceCalls.stat(descriptor) : nil
        if mask & CSHIMS_IN_ENTRY == 0 {
            if mask & CSHIMS_IN_MODIFY != 0 { found.insert(.write) }
            if mask & CSHIMS_IN_ATTRIB != 0 { found.insert(.attributes) }
            if mask & CSHIMS_IN_MOVE_SELF != 0 { found.insert(.rename) }
            if mask & CSHIMS_IN_DELETE_SELF != 0 { found.insert(.delete) }
            if mask & CSHIMS_IN_UNMOUNT != 0 { found.insert(.revoke) }
        }
        if let stat {
            seenLock.withLock {
                if stat.size > size && !isDirectory { found.insert(.extend) }
                if stat.links != links { found.insert(.link) }
                if stat.links == 0 { found.insert(.delete) }
                size = stat.size
                links = stat.links
            }
        }
        return found.intersection(events)
    }

    /// The file-system object sources of the process that wait in one
    /// place, with that place's inotify instance: the pool's poller
    /// (`pool`, for sources on work queues), a loop (`loops` keeps one
    /// registry per loop with file-system sources, up to
    /// `LoopRegistries.maximum` loops), or the reactor thread (`reactor`,
    /// for the sources of loops beyond those, or of a loop the kernel
    /// would give no instance of its own).
    final class Registry: @unchecked Sendable {
        // @unchecked: everything mutable is guarded by `lock`.

        /// Where a registry's instance is watched.
        enum Place {
            case pool
            case reactor
            case loop(ThreadLoop)
        }

        /// Sources on work queues: their instance waits in the pool's poller.
        static let pool = Registry(.pool)
        /// Sources of loops without an instance of their own: it waits on
        /// the reactor thread, which hands each call to the source's loop.
        static let reactor = Registry(.reactor)
        /// The loops' own registries.
        static let loops = LoopRegistries()

        let place: Place
        private let lock = GuardLock()
        /// The instance of the pool's and of the reactor's registry, made
        /// with the first source and kept for the process.
        private var inotify = ProcessWideDescriptor()
        /// The instance of a loop's registry (-1 for the pool's and the
        /// reactor's), given when the registry is made and handed back to
        /// `loops` when it ends.
        private let loopDescriptor: Int32
        /// A loop's registry: the descriptor source that watches its
        /// instance in the loop, and the modes it has been added in (its
        /// sources' modes; never fewer while the registry lives).
        private var loopSource: LoopSource?
        private var loopModes: Set<LoopMode> = []
        /// Set when a loop's registry ends (its last source left): it reads
        /// its instance no more, and `loops` makes a new one for the loop's
        /// next source.
        private var ended = false
        /// Why the loop could not watch the instance, once it could not: a
        /// source that joins the registry before it ends fails with it too.
        private var failure: EventSourceError?
        private var byWatch: [Int32: [FileSystemWatch]] = [:]
        /// Each registered watch's inotify watch descriptor in this
        /// registry's instance (a watch is in two registries for a moment
        /// while it moves, with a number in each).
        private var wdOf: [ObjectIdentifier: Int32] = [:]
        private var wds = [Int32](repeating: 0, count: 256)
        private var masks = [UInt32](repeating: 0, count: 256)

        private init(_ place: Place) {
            self.place = place
            loopDescriptor = -1
        }

        /// A loop's registry, on `instance` (new, or one an ended registry
        /// left: what it still has queued is read and dropped).
        fileprivate init(loop: ThreadLoop, instance: Int32) {
            place = .loop(loop)
            loopDescriptor = instance
            lock.withLock {
                var ignored: [(EventSource, EventSource.FileEvents)] = []
                collect(into: &ignored)
            }
        }

        /// "pool", "reactor" or "loop": a test's view.
        var placeName: String {
            switch place {
            case .pool: "pool"
            case .reactor: "reactor"
            case .loop: "loop"
            }
        }

        private var fd: Int32 { loopDescriptor >= 0 ? loopDescriptor : inotify.fd }

        /// Adds `watch` to the registry that serves `placement` and returns
        /// it; returns `current` and adds nothing if that registry serves
        /// `placement` already. For a loop: the loop's own registry (made if
        /// the loop has none and may have one), else the reactor's; the
        /// caller then has the registry `attach` the placement's modes.
        static func add(
            _ watch: FileSystemWatch, for source: EventSource, at placement: WatchPlacement, leaving current: Registry?
        ) throws(EventSourceError) -> Registry {
            let registry: Registry
            switch placement {
            case .pool:
                registry = pool
            case .reactor:
                registry = reactor
            case .loop(let loop, _):
                if let own = try loops.add(watch, for: source, on: loop, leaving: current) { return own }
                registry = reactor
            }
            if registry !== current { try registry.add(watch, for: source) }
            return registry
        }

        /// Where the pool's or the reactor's instance is watched; starts the
        /// reactor for the reactor's registry (which may throw).
        private func home() throws(EventSourceError) -> ProcessWideHome {
            if case .pool = place, let poller = WorkerPool.standard.poller { return .pool(poller) }
            return .loop(try EventReactor.loop())
        }

        /// Adds `watch` to the pool's or the reactor's registry.
        private func add(_ watch: FileSystemWatch, for source: EventSource) throws(EventSourceError) {
            // Before the lock: starting the reactor takes the reactor's
            // lock, which is never taken inside this one.
            let home = try home()
            lock.lock()
            defer { lock.unlock() }
            _ = try inotify.watch(at: home, EventSourceCalls.inotify) { [unowned self] in self.deliver() }
            do throws(EventSourceError) {
                try register(watch, for: source)
            } catch {
                if byWatch.isEmpty { inotify.unwatch() }
                throw error
            }
        }

        /// Adds `watch` to a loop's registry. Under `loops`' lock.
        fileprivate func addOnLoop(_ watch: FileSystemWatch, for source: EventSource) throws(EventSourceError) {
            lock.lock()
            defer { lock.unlock() }
            try register(watch, for: source)
        }

        /// Watches `watch`'s object in this registry's instance. Under the lock.
        private func register(_ watch: FileSystemWatch, for source: EventSource) throws(EventSourceError) {
            let wd = try EventSourceCalls.inotifyWatch(fd, descriptor: watch.descriptor, mask: watch.inotifyMask)
            // Unchanged by a move (the other registry may be reading it).
            if watch.source !== source { watch.source = source }
            wdOf[ObjectIdentifier(watch)] = wd
            byWatch[wd, default: []].append(watch)
        }

        /// Has a loop's registry watch its instance in `modes` too (those
        /// of a source added to it). Outside every lock: a loop that cannot
        /// watch the instance fails the registry's sources, and failing
        /// cancels them. Returns the loop's refusal if it came before (the
        /// caller fails its source with it).
        func attach(_ modes: [LoopMode]) -> EventSourceError? {
            guard case .loop(let loop) = place else { return nil }
            let (source, missing, refusal): (LoopSource?, [LoopMode], EventSourceError?) = lock.withLock {
                if let failure { return (nil, [], failure) }
                guard !ended else { return (nil, [], nil) }
                if loopSource == nil {
                    loopSource = LoopSource(
                        descriptor: EventSource.loopWatchSubstitute.withLock { $0 } ?? loopDescriptor,
                        failed: { [weak self] _, error in self?.failSources(.watchFailed(error)) }
                    ) { [weak self] _, _ in self?.deliver() }
                }
                let missing = modes.filter { !loopModes.contains($0) }
                loopModes.formUnion(missing)
                return (loopSource, missing, nil)
            }
            if let source { for mode in missing { loop.add(source, forMode: mode) } }
            return refusal
        }

        /// The loop could not watch the instance: every source waiting here
        /// fails (with nothing to wait in, they would never hear of a change).
        private func failSources(_ error: EventSourceError) {
            let sources = lock.withLock {
                failure = error
                return byWatch.values.flatMap { $0 }.compactMap(\.source)
            }
            for source in sources { source.fail(error) }
        }

        /// Ends `watch`'s registration here. `deliveringPending` (a move):
        /// first reads what the instance has queued and delivers it, so
        /// that a change reported here but not yet read is not lost with
        /// the registration (the sources of other watches get theirs now
        /// too, a little early). A loop's registry whose last watch leaves
        /// ends.
        func remove(_ watch: FileSystemWatch, deliveringPending: Bool = false) {
            if case .loop = place {
                Self.loops.remove(watch, from: self, deliveringPending: deliveringPending)
                return
            }
            var due: [(EventSource, EventSource.FileEvents)] = []
            lock.withLock {
                unregister(watch, deliveringPending: deliveringPending, into: &due)
                // Nothing left to wait for here: the poller may go unheld.
                if byWatch.isEmpty { inotify.unwatch() }
            }
            for (source, found) in due { source.or(found.rawValue) }
        }

        /// A loop's registry: `remove` under `loops`' lock. Returns whether
        /// the registry ended (then its descriptor source, to invalidate
        /// outside the locks), and what is due.
        fileprivate func removeOnLoop(
            _ watch: FileSystemWatch?, deliveringPending: Bool, into due: inout [(EventSource, EventSource.FileEvents)]
        ) -> (ended: Bool, source: LoopSource?) {
            lock.withLock {
                if let watch { unregister(watch, deliveringPending: deliveringPending, into: &due) }
                guard byWatch.isEmpty, !ended else { return (false, nil) }
                ended = true
                defer { loopSource = nil }
                return (true, loopSource)
            }
        }

        /// A loop's registry's instance.
        fileprivate var instance: Int32 { loopDescriptor }

        /// Under the lock.
        private func unregister(
            _ watch: FileSystemWatch, deliveringPending: Bool, into due: inout [(EventSource, EventSource.FileEvents)]
        ) {
            if deliveringPending && fd >= 0 && !ended { collect(into: &due) }
            guard let wd = wdOf.removeValue(forKey: ObjectIdentifier(watch)), var list = byWatch[wd] else { return }
            list.removeAll { $0 === watch }
            if list.isEmpty {
                byWatch[wd] = nil
                EventSourceCalls.inotifyUnwatch(fd, wd)
            } else {
                byWatch[wd] = list
            }
        }

        /// Where the instance waits, when it is readable.
        private func deliver() {
            var due: [(EventSource, EventSource.FileEvents)] = []
            lock.withLock { if !ended { collect(into: &due) } }
            for (source, found) in due { source.or(found.rawValue) }
        }

        /// Under the lock: reads every event the instance has queued and
        /// appends what each source is due (merged by the caller, outside
        /// the lock).
        private func collect(into due: inout [(EventSource, EventSource.FileEvents)]) {
            // Until a read takes all there is: a read that leaves room for
            // the longest event took everything queued (an event queued
            // after it makes the instance readable again, and its watch is
            // re-armed after this delivery), so no read is made only to
            // find the queue empty.
            var more = true
            while more {
                let (n, left) = EventSourceCalls.inotifyRead(fd, &wds, &masks)
                more = left
                if n == 0 { break }
                for i in 0..<n {
                    guard let list = byWatch[wds[i]] else { continue }
                    for watch in list {
                        let found = watch.translate(masks[i])
                        if !found.isEmpty, let source = watch.source { due.append((source, found)) }
                    }
                    if masks[i] & CSHIMS_IN_IGNORED != 0 {
                        // The kernel dropped the watch (deleted, unmounted):
                        // its number may be given to another file now.
                        for watch in list { wdOf[ObjectIdentifier(watch)] = nil }
                        byWatch[wds[i]] = nil
                    }
                }
            }
        }

        /// In a child after `fork()` (the pool's and the reactor's
        /// registries; `loops` forgets the loops' registries whole).
        func childAfterFork() {
            lock.reinitializeAfterFork()
            inotify.childAfterFork()
            byWatch = [:]
            wdOf = [:]
        }
    }

    /// The loops' own registries: each loop with file-system sources
    /// watches an inotify instance of its own in its backend, in every mode
    /// its sources use, so its thread reads the events and runs the calls
    /// with no other thread woken. Up to `maximum` loops at once: an
    /// instance counts against the user's `fs.inotify.max_user_instances`
    /// (128 by default, shared by every process of the user), so a process
    /// with many loops should not take them all. The sources of further
    /// loops, or of a loop when the kernel refuses another instance, wait
    /// on the reactor's instance.
    ///
    /// A registry whose last source leaves ends; its instance (its watches
    /// all removed) is kept for the next loop's registry rather than
    /// closed, so that no descriptor closes while a loop may still be
    /// taking its watch of it down.
    final class LoopRegistries: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`, taken before a
        // registry's lock, never inside it.

        /// How many loops may have an inotify instance of their own at once.
        static let maximum = 16

        private let lock = GuardLock()
        private var byLoop: [ObjectIdentifier: Registry] = [:]
        /// Instances left by ended registries, for the next ones.
        private var spares: [Int32] = []

        /// Adds `watch` to `loop`'s registry, made if the loop has none and
        /// a loop more may have its own; nil when it may not, or the kernel
        /// gives no instance (the caller uses the reactor's). Returns
        /// `current`, adding nothing, if it is the loop's registry.
        func add(
            _ watch: FileSystemWatch, for source: EventSource, on loop: ThreadLoop, leaving current: Registry?
        ) throws(EventSourceError) -> Registry? {
            // Invalidated after the unlock (it takes the loop's lock).
            var abandoned: LoopSource? = nil
            defer { abandoned?.invalidate() }
            lock.lock()
            defer { lock.unlock() }
            let registry: Registry
            if let existing = byLoop[ObjectIdentifier(loop)] {
                registry = existing
            } else {
                guard byLoop.count < Self.maximum else { return nil }
                // EMFILE here is the user's instance limit as often as the
                // process's descriptors: the reactor's instance is tried.
                guard let instance = spares.popLast() ?? (try? EventSourceCalls.inotify()) else { return nil }
                registry = Registry(loop: loop, instance: instance)
                byLoop[ObjectIdentifier(loop)] = registry
            }
            if registry === current { return registry }
            do throws(EventSourceError) {
                try registry.addOnLoop(watch, for: source)
            } catch {
                // A registry just made for this watch ends again.
                abandoned = endIfEmpty(registry, loop: loop)
                throw error
            }
            return registry
        }

        /// `Registry.remove` for a loop's registry: ends it if `watch` was
        /// its last.
        fileprivate func remove(_ watch: FileSystemWatch, from registry: Registry, deliveringPending: Bool) {
            guard case .loop(let loop) = registry.place else { return }
            var due: [(EventSource, EventSource.FileEvents)] = []
            let finished: LoopSource? = lock.withLock {
                let (ended, source) = registry.removeOnLoop(watch, deliveringPending: deliveringPending, into: &due)
                guard ended else { return nil }
                if byLoop[ObjectIdentifier(loop)] === registry { byLoop[ObjectIdentifier(loop)] = nil }
                spares.append(registry.instance)
                return source
            }
            finished?.invalidate()
            for (source, found) in due { source.or(found.rawValue) }
        }

        /// Ends `registry` if no watch is in it (its first watch could not
        /// be added). Under the lock; returns its descriptor source, if it
        /// had one, to invalidate.
        private func endIfEmpty(_ registry: Registry, loop: ThreadLoop) -> LoopSource? {
            var none: [(EventSource, EventSource.FileEvents)] = []
            let (ended, source) = registry.removeOnLoop(nil, deliveringPending: false, into: &none)
            guard ended else { return nil }
            byLoop[ObjectIdentifier(loop)] = nil
            spares.append(registry.instance)
            return source
        }

        /// In the parent before `fork()`: uses the generic types
        /// `childAfterFork` uses, so that their metadata exists (a debug
        /// build makes it on first use, under a runtime lock that another
        /// thread of the parent may hold at the fork).
        func prepareForFork() {
            lock.withLock { for registry in byLoop.values { _ = Unmanaged.passUnretained(registry) } }
        }

        /// In a child after `fork()`: the loops are the parent's, and so are
        /// the instances (open in the parent too): all are forgotten, not
        /// closed, and the registries left alone (their teardown would
        /// act on the parent's loops).
        func childAfterFork() {
            lock.reinitializeAfterFork()
            for registry in byLoop.values { _ = Unmanaged.passRetained(registry) }
            byLoop = [:]
            spares = []
        }
    }
}

extension FileSystemWatch {
    /// The generic types and conformances of this file's code, made in the
    /// parent before `fork()` (see `EventReactor.prepareForFork`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            LoopSource?.self, (LoopSource?, [LoopMode], EventSourceError?).self,
            (EventSource, EventSource.FileEvents).self, [ObjectIdentifier: Registry].self,
            [ObjectIdentifier: Registry].Values.Iterator.self, [Int32: [FileSystemWatch]].self,
            [Int32: [FileSystemWatch]].Values.self, [ObjectIdentifier: Int32].self, (ObjectIdentifier, Registry).self,
            (ObjectIdentifier, Int32).self, String?.self, [EventSource].self, [(EventSource, EventSource.FileEvents)].self,
            [FileSystemWatch].self, [LoopMode].self, [Int32].self, (ended: Bool, source: LoopSource?).self,
            Set<LoopMode>.self, IndexingIterator<[EventSource]>.self,
            IndexingIterator<[(EventSource, EventSource.FileEvents)]>.self, IndexingIterator<[FileSystemWatch]>.self,
            IndexingIterator<[LoopMode]>.self, Int32?.self, (Int32, [FileSystemWatch]).self,
            Result<Registry, EventSourceError>?.self, (@Sendable () -> Void)?.self)
        ForkHandlers.makeConformance(setAlgebra: EventSource.FileEvents.self)
        ForkHandlers.makeConformance(optionSet: EventSource.FileEvents.self)
        ForkHandlers.makeConformance(error: EventSourceError.self)
        ForkHandlers.makeConformance(hashable: LoopMode.self)
        ForkHandlers.makeConformance(sequence: [Int32: [FileSystemWatch]].Values.self)
        ForkHandlers.makeConformance(collection: [EventSource].self)
        ForkHandlers.makeConformance(collection: [(EventSource, EventSource.FileEvents)].self)
        ForkHandlers.makeConformance(mutable: [FileSystemWatch].self)
        ForkHandlers.makeConformance(sequence: [FileSystemWatch].self)
        ForkHandlers.makeConformance(collection: [FileSystemWatch].self)
        ForkHandlers.makeConformance(rangeReplaceable: [FileSystemWatch].self)
        ForkHandlers.makeConformance(sequence: [LoopMode].self)
        ForkHandlers.makeConformance(collection: [LoopMode].self)
        // `filter` on the modes: its `_ArrayProtocol` conformance (a
        // protocol the standard library does not let a module name).
        _ = [LoopMode]().filter { _ in true }
        ForkHandlers.makeConformance(bidirectional: [Int32].self)
        ForkHandlers.makeConformance(rangeReplaceable: [Int32].self)
        ForkHandlers.makeConformance(fixedWidthInteger: UInt64.self)
    }
}
