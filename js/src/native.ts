// The compiled core (js/native, napi-rs): built by `npm run build` into redis-rl.node at the
// package's root (or redis-rl.<platform>.node, as a prebuilt package ships it).
import type * as Binding from './binding';
import { existsSync } from 'fs';
import { join } from 'path';

function load(): typeof Binding {
  const root = join(__dirname, '..', '..');
  const arch = process.arch;
  const platform = process.platform;
  const names = ['redis-rl.node', `redis-rl.${platform}-${arch}.node`, `redis-rl.${platform}-${arch}-gnu.node`, `redis-rl.${platform}-${arch}-musl.node`];
  for (const name of names) {
    const path = join(root, name);
    if (existsSync(path)) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      return require(path) as typeof Binding;
    }
  }
  throw new Error(
    `redis-rl: the compiled core is missing (looked for ${names.join(', ')} in ${root}): ` +
      'run `npm run build` in the package (it needs a Rust toolchain)',
  );
}

export const native: typeof Binding = load();
export type { Binding };
