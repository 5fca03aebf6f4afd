/** An error for a log line: its class (cockatiel's errors all have the name 'Error') and message. */
export function describeError(error: unknown): string {
  const text = error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
  // An app's error (a skip function's, a hook's) may carry anything: a line stays a line.
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
