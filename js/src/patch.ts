// A command handed over by the compiled core as a patch of the last one (js/native/src/patch.rs):
// making a JS string costs more than the rest of the call, and from one call to the next only
// a budget's costs (a middleware's key) change. The shell writes the changed arguments into a
// copy of its last array; which ones changed is the core's to say.

/** Written into `positions[0]` when the strings are the whole command. */
const WHOLE = 0xffffffff;

/** One object's last command for each backend. */
export class LastCommands {
  private readonly last = new Map<string, string[]>();
  /** Where the core writes the patch's positions (count first). */
  readonly positions = new Uint32Array(64);

  /** Whether a last command for `backend` is held (the core patches it then). */
  has(backend: string): boolean {
    return this.last.has(backend);
  }

  /** The command the core's strings make: the whole of it, or a patch of the last one. */
  apply(backend: string, strings: string[]): string[] {
    const p = this.positions;
    const count = p[0]!;
    if (count === WHOLE) {
      this.last.set(backend, strings);
      return strings;
    }
    // A copy: the client may still hold the last array (a pipeline, a queued command).
    const args = this.last.get(backend)!.slice();
    for (let i = 0; i < count; i++) args[p[i + 1]!] = strings[i]!;
    this.last.set(backend, args);
    return args;
  }
}
