import type { LoggerService } from '@nestjs/common';

/** A Nest logger that keeps what it is given, so tests can assert on log lines. */
export class LogCapture implements LoggerService {
  readonly lines: { level: string; message: string; context?: string }[] = [];

  log(message: unknown, context?: string) {
    this.push('log', message, context);
  }
  error(message: unknown, ...rest: unknown[]) {
    this.push('error', message, rest.at(-1) as string | undefined);
  }
  warn(message: unknown, context?: string) {
    this.push('warn', message, context);
  }
  debug(message: unknown, context?: string) {
    this.push('debug', message, context);
  }
  verbose(message: unknown, context?: string) {
    this.push('verbose', message, context);
  }

  at(level: string, pattern: RegExp = /.*/): string[] {
    return this.lines.filter((line) => line.level === level && pattern.test(line.message)).map((line) => line.message);
  }

  private push(level: string, message: unknown, context?: string) {
    this.lines.push({ level, message: String(message), context });
  }
}
