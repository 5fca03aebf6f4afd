import { BadRequestException, Body, Controller, type ExecutionContext, Post } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

interface CompletionRequest {
  prompt?: unknown;
  /** The most tokens the answer may use: reserved up front. Default 1,000. */
  max_tokens?: unknown;
}

interface Completion {
  text: string;
  usage: { total_tokens: number };
}

function tenantOf(context: ExecutionContext): string | undefined {
  return context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'];
}

/** The prompt's tokens (about one per 4 characters) and a short answer: what a call is expected to use. */
function estimateOf(body: CompletionRequest | undefined): number {
  const prompt = typeof body?.prompt === 'string' ? body.prompt : '';
  return Math.min(maxTokensOf(body), Math.ceil(prompt.length / 4) + 10);
}

const bodyOf = (context: ExecutionContext) => context.switchToHttp().getRequest<{ body?: CompletionRequest }>().body;

function maxTokensOf(body: CompletionRequest | undefined): number {
  const max = body?.max_tokens ?? 1_000;
  if (typeof max !== 'number' || !Number.isSafeInteger(max) || max < 1 || max > 10_000) {
    throw new BadRequestException('max_tokens must be a whole number from 1 to 10000');
  }
  return max;
}

@Controller()
export class CompletionsController {
  /**
   * A token budget as an LLM API keeps one: 10,000 tokens a minute per tenant (`x-tenant`). A call
   * reserves an estimate; once the "model" has answered, the tokens it used are charged instead
   * (the rest refunded, an overrun charged in full: the tenant's next calls wait for it). Until then
   * it also holds its `max_tokens` against the tenant's other calls, so calls running together
   * never overdraw the budget by more than one call's overrun. Live under `demo.completions`; one
   * tenant's own budget with `set-override demo.completions <tenant> count=…`.
   */
  @Post('completions')
  @RateLimit({
    count: 10_000,
    window: '1m',
    configKey: 'demo.completions',
    by: (context) => tenantOf(context) ?? 'no-tenant',
    cost: (context) => estimateOf(bodyOf(context)), // reserved up front
    settleCost: {
      actual: (result) => (result as Completion).usage.total_tokens, // charged once answered
      max: (context) => maxTokensOf(bodyOf(context)), // the most a call may use
    },
  })
  complete(@Body() body: CompletionRequest | undefined): Completion {
    const max = maxTokensOf(body);
    const prompt = typeof body?.prompt === 'string' ? body.prompt : '';
    // A stand-in for the model: an answer of about a token per 4 characters of prompt, and 50 more.
    const used = Math.min(max, Math.ceil(prompt.length / 4) + 50);
    return { text: 'lorem ipsum '.repeat(Math.ceil(used / 3)).trim(), usage: { total_tokens: used } };
  }
}
