// A token budget under the `openai` npm SDK (or anything that takes a fetch, for an
// OpenAI-compatible API): a fetch that reserves each chat completion's estimate before it is
// sent and settles its `usage` when the reply (or its stream) ends. The twin of the Python
// package's BudgetTransport (redis_rl.openai), with the same semantics: the estimate, the
// usage and the stream reader are the client core's.
//
//     const client = new OpenAI({ fetch: budgetFetch(budget) });

import type { Reservation, TokenBudget } from './budget';
import { DEFAULT_MAX_TOKENS, StreamUsage, chatUsage, estimateChat, splitUsage, type ChatUsage } from './openai';

export interface BudgetFetchOptions {
  /** The fetch the calls go on (default: the global `fetch`). */
  fetch?: typeof fetch;
  /** The output reserved for a request that sets no `max_tokens` (4096). */
  defaultMaxTokens?: number;
  /** Milliseconds a refused reservation may wait before the fetch answers 429 (default 0). */
  waitMs?: number;
}

const REQUESTS = 'requests';

/** Error codes of a connection that never reached the provider (nothing was sent). */
const NEVER_REACHED = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EADDRNOTAVAIL',
  'UND_ERR_CONNECT_TIMEOUT',
]);

function urlOf(input: string | URL | Request): URL | null {
  try {
    if (typeof input === 'string') return new URL(input);
    if (input instanceof URL) return input;
    return new URL(input.url);
  } catch {
    return null;
  }
}

function methodOf(input: string | URL | Request, init: RequestInit | undefined): string {
  if (init?.method !== undefined) return init.method.toUpperCase();
  if (typeof input === 'object' && !(input instanceof URL)) return input.method.toUpperCase();
  return 'GET';
}

function isChat(input: string | URL | Request, init: RequestInit | undefined): boolean {
  if (methodOf(input, init) !== 'POST') return false;
  const url = urlOf(input);
  return url !== null && url.pathname.replace(/\/+$/, '').endsWith('/chat/completions');
}

/** The request's body as bytes, or null when it is not one we can read (a stream, a form). */
async function bodyOf(input: string | URL | Request, init: RequestInit | undefined): Promise<Buffer | null> {
  const body = init?.body;
  if (body === undefined || body === null) {
    if (typeof input === 'object' && !(input instanceof URL) && input.body !== null) {
      return Buffer.from(await input.clone().arrayBuffer());
    }
    return null;
  }
  if (typeof body === 'string') return Buffer.from(body);
  if (body instanceof ArrayBuffer) return Buffer.from(body);
  if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (typeof Blob !== 'undefined' && body instanceof Blob) return Buffer.from(await body.arrayBuffer());
  return null;
}

function withBody(input: string | URL | Request, init: RequestInit | undefined, body: Buffer): RequestInit {
  const out: RequestInit = { ...init, body };
  if (typeof input === 'object' && !(input instanceof URL)) {
    out.method = init?.method ?? input.method;
  }
  const headers = new Headers(init?.headers ?? (typeof input === 'object' && !(input instanceof URL) ? input.headers : undefined));
  headers.delete('content-length');
  out.headers = headers;
  return out;
}

function json(status: number, headers: Record<string, string>, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json', ...headers },
  });
}

/** Refused by the budget: the 429 the provider would answer, its wait the budget's. */
function refused(res: Reservation): Response {
  const ms = Math.max(1, Math.ceil(res.retryAfterMs));
  const kind = res.deniedBy === REQUESTS ? 'requests' : 'tokens';
  const message =
    `Rate limit reached by the shared budget (redis-rl) on its ${JSON.stringify(res.deniedBy)} limit: ` +
    `retry after ${ms} ms.`;
  return json(
    429,
    {
      'retry-after': String(Math.ceil(ms / 1000)),
      'retry-after-ms': String(ms),
      'x-redis-rl-denied-by': String(res.deniedBy),
    },
    { error: { message, type: kind, code: 'rate_limit_exceeded' } },
  );
}

/** A request above a limit's burst can never be reserved: 429 without retry-after. */
function tooLarge(why: string): Response {
  return json(
    429,
    { 'x-redis-rl-denied-by': 'too_large' },
    {
      error: {
        message: `Request too large for the shared budget (redis-rl): ${why}`,
        type: 'tokens',
        code: 'rate_limit_exceeded',
      },
    },
  );
}

/** The reply's headers for its body passed on decoded (fetch decoded it already). */
function passedHeaders(response: Response): Headers {
  const headers = new Headers(response.headers);
  for (const h of ['content-encoding', 'content-length', 'transfer-encoding']) headers.delete(h);
  return headers;
}

/** Whether a fetch error is a connection that never reached the provider. */
function neverReached(e: unknown): boolean {
  for (let err = e, depth = 0; err !== null && typeof err === 'object' && depth < 5; depth++) {
    const code = (err as { code?: unknown }).code;
    if (typeof code === 'string' && NEVER_REACHED.has(code)) return true;
    err = (err as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * A fetch that charges every chat completion (`POST .../chat/completions`) to `budget`; other
 * requests pass as they are. For the `openai` SDK: `new OpenAI({ fetch: budgetFetch(budget) })`.
 *
 * - It reserves the client core's estimate (a budget with `input` and `output` limits each its
 *   part, one with a single token limit both; `requests` 1), and settles the reply's `usage`
 *   (the estimate if it has none); a stream that did not ask for its usage is made to, and the
 *   usage event is kept from the caller. An error reply (the provider's 429 too) settles the
 *   tokens at 0; a connection that never reached the provider too; a call that broke off after
 *   it was sent, the estimate.
 * - Refused by the budget, it answers 429 itself (an OpenAI error body, `retry-after`,
 *   `retry-after-ms`, `x-redis-rl-denied-by`) without calling the provider, so the SDK's own
 *   retries wait as long as the budget says; `waitMs` waits here instead. A request above a
 *   limit's burst is refused as too large (no `retry-after`).
 */
export function budgetFetch(budget: TokenBudget, options: BudgetFetchOptions = {}): typeof fetch {
  const defaultMaxTokens = options.defaultMaxTokens ?? DEFAULT_MAX_TOKENS;
  const waitMs = options.waitMs ?? 0;
  const inner = (input: string | URL | Request, init?: RequestInit): Promise<Response> =>
    (options.fetch ?? globalThis.fetch)(input, init);

  const actual = (usage: ChatUsage | null): Record<string, number> | undefined =>
    usage === null ? undefined : splitUsage(budget.names, usage);
  const zero = (): Record<string, number> => {
    const out: Record<string, number> = {};
    for (const name of budget.names) if (name !== REQUESTS) out[name] = 0;
    return out;
  };

  async function charged(input: string | URL | Request, init?: RequestInit): Promise<Response> {
    if (!isChat(input, init)) return inner(input, init);
    const raw = await bodyOf(input, init);
    if (raw === null) return inner(input, init);
    let e;
    try {
      e = estimateChat(raw, defaultMaxTokens);
    } catch (err) {
      if (err instanceof RangeError) return inner(input, init); // the provider will say what is wrong
      throw err;
    }
    let res: Reservation;
    try {
      res = await budget.reserve(splitUsage(budget.names, { input: e.input, output: e.output }), { waitMs });
    } catch (err) {
      if (err instanceof RangeError) return tooLarge(err.message);
      throw err;
    }
    if (!res.granted) return refused(res);

    let settled = false;
    const settle = async (used: Record<string, number> | undefined): Promise<void> => {
      if (settled) return;
      settled = true;
      await res.settle(used);
    };

    let response: Response;
    try {
      response = await inner(input, e.body !== null ? withBody(input, init, e.body) : init);
    } catch (err) {
      await settle(neverReached(err) ? zero() : undefined);
      throw err;
    }
    if (response.status !== 200) {
      await settle(zero());
      return response;
    }
    if (!e.stream || response.body === null) {
      const content = Buffer.from(await response.arrayBuffer());
      await settle(actual(chatUsage(content)));
      return new Response(content, {
        status: response.status,
        statusText: response.statusText,
        headers: passedHeaders(response),
      });
    }

    const reader = new StreamUsage(e.hideUsage);
    const source = response.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        for (;;) {
          let chunk: Awaited<ReturnType<typeof source.read>>;
          try {
            chunk = await source.read();
          } catch (err) {
            // Broken off mid-stream: the usage seen so far (the estimate if none).
            await settle(actual(reader.usage()));
            controller.error(err);
            return;
          }
          if (chunk.done) {
            const rest = reader.finish();
            if (rest.length > 0) controller.enqueue(new Uint8Array(rest));
            await settle(actual(reader.usage()));
            controller.close();
            return;
          }
          const out = reader.feed(chunk.value);
          if (out.length > 0) {
            controller.enqueue(new Uint8Array(out));
            return;
          }
        }
      },
      async cancel(reason) {
        try {
          await source.cancel(reason);
        } finally {
          await settle(actual(reader.usage()));
        }
      },
    });
    return new Response(body, {
      status: response.status,
      statusText: response.statusText,
      headers: passedHeaders(response),
    });
  }

  return charged as typeof fetch;
}
