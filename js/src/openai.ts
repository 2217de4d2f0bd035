// What a token budget reserves for an OpenAI-compatible chat completion and what it settles:
// the client core's estimate of the request, the usage of the reply, and the stream reader
// that finds (and, when the caller did not ask for it, hides) the usage event. The same code
// as the Python package's BudgetTransport.

import type * as Binding from './binding';
import { core } from './errors';
import { native } from './native';

/** The output tokens reserved for a request without `max_tokens` (the Python client's). */
export const DEFAULT_MAX_TOKENS = 4096;

export interface ChatEstimate {
  input: number;
  output: number;
  stream: boolean;
  /** The body to send instead (a stream asks for its usage), when it changed. */
  body: Buffer | null;
  /** Whether the caller did not ask for the usage event (so it is kept from it). */
  hideUsage: boolean;
}

export interface ChatUsage {
  input: number;
  output: number;
}

function bytes(body: Buffer | Uint8Array | string): Buffer {
  if (typeof body === 'string') return Buffer.from(body);
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError('a body: a Buffer, a Uint8Array or a string');
}

/** The estimate of a chat completion request body: a `RangeError` for one that is no request. */
export function estimateChat(body: Buffer | Uint8Array | string, defaultMaxTokens = DEFAULT_MAX_TOKENS): ChatEstimate {
  const e = core(() => native.estimateChat(bytes(body), defaultMaxTokens));
  return { input: e.input, output: e.output, stream: e.stream, body: e.body ?? null, hideUsage: e.hideUsage };
}

/** The `usage` of a (non-streamed) reply body, or null. */
export function chatUsage(body: Buffer | Uint8Array | string): ChatUsage | null {
  return core(() => native.chatUsage(bytes(body)));
}

/**
 * A budget's costs (or actuals) for `input` and `output` tokens, by limit name: its `input` and
 * `output` limits each their part, another token limit (`tokens`) both; `requests` is left out.
 */
export function splitUsage(names: string[], usage: ChatUsage): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of core(() => native.splitUsage(names, usage.input, usage.output))) out[c.name] = c.tokens;
  return out;
}

/** Reads a streamed reply (server-sent events) as it passes; `feed` returns what to pass on. */
export class StreamUsage {
  private readonly inner: Binding.StreamUsage;
  constructor(hide: boolean) {
    this.inner = core(() => new native.StreamUsage(hide));
  }
  feed(chunk: Buffer | Uint8Array | string): Buffer {
    return core(() => this.inner.feed(bytes(chunk)));
  }
  finish(): Buffer {
    return core(() => this.inner.finish());
  }
  /** The usage seen so far. */
  usage(): ChatUsage | null {
    return this.inner.usage();
  }
}
