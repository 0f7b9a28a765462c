// An approval's links in a real browser (headless Chromium, JavaScript off: the pages need
// none), as scripts/swagger-ui-check runs it in the same browser as Swagger UI. The service
// needs CHECKOUT_APPROVAL_ABOVE=USD:100.00, CHECKOUT_PUBLIC_URL (its own address) and
// CHECKOUT_WEBHOOK_URL pointing at a consumer that appends each event it receives, as one
// JSON line {"id", "body"}, to HOOKS_FILE. It charges 150.00 (202), takes the links from
// the delivered approval.requested, opens both pages, presses Approve (waiting through the
// page's refresh while the charge is being made) and then, on the deny page opened before,
// Deny; it checks what each page shows against the API and the events delivered. Prints
// what it saw; returns the mismatches.
const fs = require('fs');

async function checkLinks(browser, base, hooksFile) {
  const mismatches = [];
  const expect = (ok, what) => {
    console.log(`${ok ? 'ok' : 'MISMATCH'}: ${what}`);
    if (!ok) mismatches.push(what);
  };
  const api = async (method, path, headers = {}) => {
    const r = await fetch(base + path, { method, headers });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
    return { status: r.status, json, text };
  };
  const events = () => (fs.existsSync(hooksFile) ? fs.readFileSync(hooksFile, 'utf8') : '')
    .split('\n').filter(Boolean).map((line) => JSON.parse(line).body);
  const waitFor = async (what, found, ms = 20000) => {
    const end = Date.now() + ms;
    for (;;) {
      const value = found();
      if (value) return value;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  // What a page shows: its heading, its facts (<dl>: term → text), its buttons.
  const read = async (page) => ({
    heading: await page.locator('h1').innerText(),
    facts: await page.$$eval('dl dt', (dts) => Object.fromEntries(
      dts.map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))),
    buttons: await page.locator('form[method="post"] button').allInnerTexts(),
    scripts: await page.locator('script').count(),
  });
  const about = (order) => (e) => e.data.orderId === order;

  const orderId = `LINK-${Date.now()}`;
  const paused = await api('POST', `/checkout?orderId=${orderId}&amount=150.00`, { 'idempotency-key': orderId });
  console.log(`POST /checkout?orderId=${orderId}&amount=150.00: ${paused.status}`);
  expect(paused.status === 202, 'above the threshold, the checkout waits for a person (202)');
  const id = paused.json.approval.id;
  const requested = await waitFor('approval.requested', () => events().find(
    (e) => e.type === 'approval.requested' && e.data.id === id));
  const { approveUrl, denyUrl } = requested.data;
  console.log(`approval.requested delivered for approval ${id}, with approveUrl and denyUrl`);
  const view = (await api('GET', `/approvals/${id}`)).json;

  const context = await browser.newContext({ javaScriptEnabled: false });
  const approvePage = await context.newPage();
  const denyPage = await context.newPage();
  await approvePage.goto(approveUrl);
  await denyPage.goto(denyUrl);
  const shown = await read(approvePage);
  const denyShown = await read(denyPage);
  console.log(`approve page: ${JSON.stringify(shown)}`);
  console.log(`deny page: ${JSON.stringify(denyShown)}`);
  const facts = shown.facts;
  expect(facts.Order === orderId && facts.Amount === `150.00 ${view.currency}`
    && facts.Caller === view.caller && facts.Status === 'pending'
    && Math.abs(Date.parse(facts.Expires) - Date.parse(view.expiresAt)) < 1000,
  'the approve page shows the order, amount, caller, expiry and status as GET /approvals/{id}');
  expect(JSON.stringify(shown.buttons) === '["Approve"]' && JSON.stringify(denyShown.buttons) === '["Deny"]',
    'the approve page has the Approve button, the deny page the Deny button');
  expect(shown.scripts === 0 && denyShown.scripts === 0, 'neither page has a script');
  const pending = await api('GET', '/approvals?status=pending');
  const stillPending = (await api('GET', `/approvals/${id}`)).json.status;
  const noReceipt = (await api('GET', `/receipts/${orderId}`)).status;
  console.log(`after opening both pages: approval ${stillPending}, GET /receipts/${orderId} ${noReceipt}`);
  expect(stillPending === 'pending' && pending.json.approvals.some((a) => a.id === id) && noReceipt === 404,
    'opening the pages changed nothing: still pending, no receipt');

  // Approve: the POST's page, then (while the charge is being made) its refresh to the link.
  const answered = approvePage.waitForResponse((r) => r.request().method() === 'POST');
  await approvePage.click('form[method="post"] button');
  const post = await answered;
  console.log(`pressed Approve: POST answered ${post.status()} ${post.headers()['content-type']}`);
  expect(post.status() === 200 && post.headers()['content-type'].startsWith('text/html'),
    'the button\'s POST answers an HTML page');
  await approvePage.waitForSelector('#receipt-id', { timeout: 20000 });
  const approved = await read(approvePage);
  console.log(`the page after Approve: ${JSON.stringify(approved)}`);
  const receipt = await api('GET', `/receipts/${orderId}`);
  const decided = (await api('GET', `/approvals/${id}`)).json;
  console.log(`GET /receipts/${orderId}: ${receipt.status} ${receipt.json && receipt.json.id}; approval ${decided.status} by ${decided.decidedBy}`);
  expect(receipt.status === 200 && approved.facts.Receipt === receipt.json.id
    && approved.facts.Amount === `150.00 ${receipt.json.currency}` && approved.facts.Order === orderId,
  'the page shows the receipt GET /receipts/{orderId} has (order, amount, receipt id)');
  expect(decided.status === 'approved' && decided.decidedBy === 'link', 'the approval is approved, by the link');
  await waitFor('charge.succeeded', () => events().some((e) => e.type === 'charge.succeeded' && about(orderId)(e)));

  // Deny, pressed on the deny page opened before the approval: refused.
  const refusedAnswer = denyPage.waitForResponse((r) => r.request().method() === 'POST');
  await denyPage.click('form[method="post"] button');
  const refused = await refusedAnswer;
  await denyPage.waitForLoadState();
  const refusedPage = await read(denyPage);
  const refusedText = await denyPage.locator('body').innerText();
  console.log(`pressed Deny: POST answered ${refused.status()}; the page: ${JSON.stringify(refusedText)}`);
  expect(refused.status() === 409 && refusedPage.heading.includes('decided the other way'),
    'Deny after the approval is refused (409), as a page');
  await denyPage.goto(denyUrl);
  const after = await read(denyPage);
  console.log(`the deny link's page now: ${JSON.stringify(after)}`);
  expect(after.facts.Status === 'approved' && after.facts.Receipt === receipt.json.id && after.buttons.length === 0,
    'the deny link\'s page now shows approved with the receipt, and no button');
  const last = await api('GET', `/receipts/${orderId}`);
  const final = (await api('GET', `/approvals/${id}`)).json.status;
  await new Promise((r) => setTimeout(r, 500));
  const all = events();
  const count = (type) => all.filter((e) => e.type === type && (e.data.orderId === orderId || e.data.id === id)).length;
  console.log(`events for the order: approval.requested ${count('approval.requested')}, approval.approved ${count('approval.approved')}, approval.denied ${count('approval.denied')}, charge.succeeded ${count('charge.succeeded')}`);
  expect(last.json.id === receipt.json.id && final === 'approved' && count('charge.succeeded') === 1
    && count('approval.approved') === 1 && count('approval.denied') === 0,
  'still one receipt, one charge.succeeded, the approval approved');
  await context.close();
  return mismatches;
}

module.exports = { checkLinks };
