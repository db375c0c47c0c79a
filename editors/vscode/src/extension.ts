/** The diffusion-lsp client: starts the server, and wires its inline completions, commands,
 * next edits, drafts and status into VS Code. */

import * as vscode from "vscode";
import { LanguageClient, type LanguageClientOptions, State } from "vscode-languageclient/node";

import { registerCommands } from "./commands";
import { SECTION, serverOptions, serverSettings } from "./config";
import { Drafts } from "./drafts";
import { NextEdit } from "./nextEdit";
import { ProgressStatusFeature, Status } from "./status";
import { trace } from "./trace";

let client: LanguageClient | undefined;
let requests = 0; // inline completion requests so far, to pair their start and end in the trace

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const status = new Status();
  const output = vscode.window.createOutputChannel("diffusion-lsp", { log: true });
  context.subscriptions.push(status, output);

  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: serverSettings(),
    synchronize: { configurationSection: SECTION },
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const where = {
          request: ++requests,
          uri: document.uri.toString(),
          version: document.version,
          line: position.line,
          character: position.character,
          trigger: context.triggerKind === vscode.InlineCompletionTriggerKind.Invoke ? "invoked" : "automatic",
        };
        trace({ event: "inlineStart", ...where });
        try {
          const result = await status.track(Promise.resolve(next(document, position, context, token)));
          const items = Array.isArray(result) ? result : (result?.items ?? []);
          const outcome = token.isCancellationRequested ? "cancelled" : items.length > 0 ? "served" : "empty";
          const first = items[0]?.insertText;
          trace({ event: "inline", ...where, outcome, items: items.length, text: typeof first === "string" ? first : first?.value });
          return result;
        } catch (err) {
          trace({ event: "inline", ...where, outcome: token.isCancellationRequested ? "cancelled" : "failed", error: String(err) });
          throw err;
        } finally {
          drafts?.clear(document.uri.toString());
        }
      },
    },
  };

  client = new LanguageClient("diffusionLsp", "diffusion-lsp", serverOptions(), clientOptions);
  client.registerFeature(new ProgressStatusFeature(client, status));
  const drafts: Drafts | undefined = new Drafts(client);
  const nextEdit = new NextEdit(client, status);
  context.subscriptions.push(
    drafts,
    nextEdit,
    client.onDidChangeState(({ newState }) => {
      if (newState === State.Stopped) {
        status.set("error", "the server stopped");
      }
    }),
    ...registerCommands(() => client, status),
    vscode.commands.registerCommand("diffusionLsp.nextEdit", () => {
      const editor = vscode.window.activeTextEditor;
      return editor ? nextEdit.suggest(editor) : undefined;
    }),
    vscode.commands.registerCommand("diffusionLsp.acceptNextEdit", () => nextEdit.accept()),
    vscode.commands.registerCommand("diffusionLsp.dismissNextEdit", () => nextEdit.dismiss()),
    vscode.commands.registerCommand("diffusionLsp.showOutput", () => output.show()),
    vscode.commands.registerCommand("diffusionLsp.restartServer", () => client?.restart()),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration(`${SECTION}.server`)) {
        void vscode.window
          .showInformationMessage("diffusion-lsp: restart the server to use the new server command", "Restart")
          .then(async (choice) => {
            if (choice) {
              await client?.restart();
            }
          });
      }
    }),
  );

  try {
    await client.start();
    trace({ event: "started" });
  } catch (err) {
    status.set("error", String(err));
    trace({ event: "startFailed", error: String(err) });
    void vscode.window.showErrorMessage(`diffusion-lsp failed to start: ${String(err)}`);
  }
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
