import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { LimiterStep, StepEntry } from './limiter-step.js';
import type { PreparedRule } from './prepare-hits.js';

/** The steps of a request none of whose rules uses one: one shared list. */
const NONE: readonly LimiterStep[] = Object.freeze([]);

/**
 * The limiter's steps, as the module composed them from its options and the features rules use,
 * in the order they run; and which of them each rule's requests run, found once per rule. A rule's
 * step is made when the first rule that uses it is decided: a feature no rule uses costs nothing,
 * and a request whose rules use none runs none, paying one lookup per rule for the seam.
 */
export class LimiterSteps {
  private readonly ofRule = new WeakMap<RateLimitRule, readonly LimiterStep[]>();
  private readonly made = new Map<StepEntry, LimiterStep>();
  /** The steps of the module's options, which every request runs. */
  private readonly everyRequest: readonly LimiterStep[];

  constructor(private readonly entries: readonly StepEntry[]) {
    for (const entry of entries) if (!entry.uses) this.made.set(entry, entry.make());
    this.everyRequest = this.made.size === 0 ? NONE : [...this.made.values()];
  }

  /** The steps a request of these rules runs, in order; of none (refused before any was prepared), the options'. */
  of(prepared: readonly PreparedRule[]): readonly LimiterStep[] {
    if (this.entries.length === 0) return NONE;
    if (prepared.length === 1) return this.forRule(prepared[0].rule);
    let steps: readonly LimiterStep[] = this.everyRequest;
    for (const { rule } of prepared) {
      const own = this.forRule(rule);
      if (own === steps || own.length === 0) continue;
      steps = steps.length === 0 ? own : this.inOrder((step) => steps.includes(step) || own.includes(step));
    }
    return steps;
  }

  released(keys: readonly string[], how: 'reset' | 'settled'): void {
    for (const step of this.made.values()) step.released?.(keys, how);
  }

  close(): void {
    for (const step of this.made.values()) step.close?.();
  }

  private forRule(rule: RateLimitRule): readonly LimiterStep[] {
    let steps = this.ofRule.get(rule);
    if (!steps) {
      const used: LimiterStep[] = [];
      for (const entry of this.entries) {
        if (entry.uses && !entry.uses(rule)) continue;
        let step = this.made.get(entry);
        if (!step) this.made.set(entry, (step = entry.make()));
        used.push(step);
      }
      steps = used.length === 0 ? NONE : used;
      this.ofRule.set(rule, steps);
    }
    return steps;
  }

  private inOrder(kept: (step: LimiterStep) => boolean): LimiterStep[] {
    return this.entries.flatMap((entry) => {
      const step = this.made.get(entry);
      return step && kept(step) ? [step] : [];
    });
  }
}
