/* What a running agent asks in the transcript, answered from it: approval prompts, the
   agent's questions (choices or typed text), and "Continue" under an answer cut off at the
   token limit. transcript.js renders them; the answers go through the app's call(). */

import { post } from "./api.js";

const CONTINUE_MESSAGE = "Continue from where your answer was cut off.";

export class RunPrompts {
  constructor(transcript, app) {
    this.app = app;
    transcript.addEventListener("click", (event) => this.onApprovalClick(event));
    transcript.addEventListener("click", (event) => this.onContinueClick(event));
    transcript.addEventListener("click", (event) => this.onClarifyChoice(event));
    transcript.addEventListener("submit", (event) => this.onClarifySubmit(event));
  }

  /** An answer to an approval prompt ("Allow once", "Deny", ...: transcript.js renders them). */
  async onApprovalClick(event) {
    const button = event.target.closest(".approval-actions button");
    if (!button) return;
    const actions = button.parentElement;
    for (const b of actions.querySelectorAll("button")) b.disabled = true;
    const res = await this.app.call(() =>
      post("/api/chat/approve", {
        stream_id: actions.dataset.stream,
        approval_id: actions.dataset.approval,
        choice: button.dataset.choice,
      }),
    );
    for (const b of actions.querySelectorAll("button")) b.disabled = false;
    if (res && !res.accepted) this.app.notify("That question is no longer open.");
  }

  /** "Continue" under an answer cut off at the token limit: a new turn asking for the rest. */
  async onContinueClick(event) {
    const button = event.target.closest("button.continue");
    if (!button) return;
    button.hidden = true;
    await this.app.send(CONTINUE_MESSAGE, []);
  }

  /** One of the agent's choices on a question card (transcript.js renders them). */
  onClarifyChoice(event) {
    const button = event.target.closest(".clarify-choices button");
    if (button) this.answerQuestion(button.closest("form"), button.dataset.answer);
  }

  /** Free text typed into a question card. */
  onClarifySubmit(event) {
    const form = event.target.closest(".clarify-actions");
    if (!form) return;
    event.preventDefault();
    const input = form.querySelector(".clarify-input");
    if (input.value.trim()) this.answerQuestion(form, input.value, input);
  }

  /** The answer goes to the run; typed text stays in the box unless it was taken. */
  async answerQuestion(form, text, input = null) {
    const buttons = form.querySelectorAll("button");
    for (const b of buttons) b.disabled = true;
    const res = await this.app.call(() =>
      post("/api/chat/answer", {
        stream_id: form.dataset.stream,
        question_id: form.dataset.question,
        text,
      }),
    );
    for (const b of buttons) b.disabled = false;
    if (res?.accepted && input) input.value = "";
    if (res && !res.accepted) this.app.notify("That question is no longer open.");
  }
}
