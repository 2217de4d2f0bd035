// The ESM entry: a wrapper over the CommonJS build (one copy of every class, whichever way
// the package is loaded), and its types; the compiled core's declarations beside the build.
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
copyFileSync(join(root, 'src', 'binding.d.ts'), join(root, 'dist', 'cjs', 'binding.d.ts'));
const names = Object.keys(createRequire(import.meta.url)(join(root, 'dist', 'cjs', 'index.js')))
  .filter((n) => n !== '__esModule')
  .sort();
mkdirSync(join(root, 'dist', 'esm'), { recursive: true });
writeFileSync(
  join(root, 'dist', 'esm', 'index.mjs'),
  `import cjs from '../cjs/index.js';\n\nexport const {\n${names.map((n) => `  ${n},`).join('\n')}\n} = cjs;\n`,
);
writeFileSync(join(root, 'dist', 'esm', 'index.d.mts'), "export * from '../cjs/index.js';\n");
